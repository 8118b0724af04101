// JSON payloads encoded by registered schemas: Avro (avro-c), JSON Schema
// (RapidJSON's validator), Protobuf (libprotobuf's DynamicMessage and JSON
// parser). Each codec is compiled once per schema and reused for every
// record of it.
#include <avro.h>

#include <google/protobuf/compiler/parser.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor_database.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/json_util.h>
#include <rapidjson/document.h>
#include <rapidjson/error/en.h>
#include <rapidjson/schema.h>
#include <rapidjson/stringbuffer.h>
#include <simdjson.h>

#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "walrelay/schema_registry.hpp"

namespace walrelay {

std::string wire_prefix(RegistryFormat format, int schema_id) {
  std::string p(5, '\0');
  const auto id = static_cast<std::uint32_t>(schema_id);
  p[1] = static_cast<char>(id >> 24);
  p[2] = static_cast<char>(id >> 16);
  p[3] = static_cast<char>(id >> 8);
  p[4] = static_cast<char>(id);
  // Protobuf: the path of message indexes to the message type; the first
  // top-level message, [0], is written as a single 0.
  if (format == RegistryFormat::protobuf) p += '\0';
  return p;
}

namespace {

MapError mismatch(const std::string& path, const std::string& why) {
  return MapError{"schema_mismatch", "the payload does not fit the schema at " + (path.empty() ? "/" : path) + ": " + why};
}

// ---------------------------------------------------------------- Avro

class AvroCodec final : public SchemaCodec {
 public:
  explicit AvroCodec(const RegisteredSchema& registered) {
    if (avro_schema_from_json_length(registered.text.data(), registered.text.size(), &schema_))
      throw RegistryError("bad_schema", "subject \"" + registered.subject + "\" schema id " +
                                            std::to_string(registered.id) + " is not an Avro schema avro-c reads: " +
                                            avro_strerror());
    iface_ = avro_generic_class_from_schema(schema_);
    if (!iface_ || avro_generic_value_new(iface_, &value_)) {
      cleanup();
      throw RegistryError("bad_schema", "subject \"" + registered.subject + "\": " + avro_strerror());
    }
    writer_ = avro_writer_memory(nullptr, 0);
    collect_defaults(nlohmann::json::parse(registered.text, nullptr, false), "");
  }
  ~AvroCodec() override { cleanup(); }

  std::optional<MapError> encode(std::string_view json, std::string& out) override {
    padded_.assign(json);
    padded_.append(simdjson::SIMDJSON_PADDING, '\0');
    simdjson::dom::element root;
    if (parser_.parse(padded_.data(), json.size(), false).get(root))
      return MapError{"bad_content", "the payload is not JSON, which the schema's encoding takes"};
    avro_value_reset(&value_);
    path_.clear();
    if (auto e = fill(value_, schema_, root)) return e;
    std::size_t size = 0;
    if (avro_value_sizeof(&value_, &size)) return MapError{"schema_mismatch", avro_strerror()};
    const std::size_t at = out.size();
    out.resize(at + size);
    avro_writer_memory_set_dest(writer_, out.data() + at, static_cast<std::int64_t>(size));
    if (avro_value_write(writer_, &value_)) return MapError{"schema_mismatch", avro_strerror()};
    return std::nullopt;
  }

 private:
  void cleanup() {
    if (writer_) avro_writer_free(writer_);
    if (iface_) {
      avro_value_decref(&value_);
      avro_value_iface_decref(iface_);
    }
    if (schema_) avro_schema_decref(schema_);
    writer_ = nullptr;
    iface_ = nullptr;
    schema_ = nullptr;
  }

  // Field defaults by record name and field name: avro-c keeps none.
  void collect_defaults(const nlohmann::json& s, const std::string& ns) {
    if (s.is_array()) {
      for (auto& b : s) collect_defaults(b, ns);
      return;
    }
    if (!s.is_object()) return;
    const std::string type = s.value("type", "");
    std::string space = s.contains("namespace") && s["namespace"].is_string() ? s["namespace"].get<std::string>() : ns;
    if (type == "record" || type == "error") {
      std::string name = s.value("name", "");
      if (auto dot = name.rfind('.'); dot != std::string::npos) {
        space = name.substr(0, dot);
        name = name.substr(dot + 1);
      }
      if (s.contains("fields") && s["fields"].is_array())
        for (auto& f : s["fields"]) {
          if (!f.is_object()) continue;
          if (f.contains("default")) defaults_[name + "\n" + f.value("name", "")] = f["default"].dump();
          if (f.contains("type")) collect_defaults(f["type"], space);
        }
    } else if (type == "array" && s.contains("items")) {
      collect_defaults(s["items"], space);
    } else if (type == "map" && s.contains("values")) {
      collect_defaults(s["values"], space);
    } else if (s.contains("type") && (s["type"].is_object() || s["type"].is_array())) {
      collect_defaults(s["type"], space);
    }
  }

  static avro_schema_t resolve(avro_schema_t s) {
    while (avro_typeof(s) == AVRO_LINK) s = avro_schema_link_target(s);
    return s;
  }

  // What a JSON value is, for messages.
  static const char* json_kind(simdjson::dom::element j) {
    switch (j.type()) {
      case simdjson::dom::element_type::ARRAY: return "an array";
      case simdjson::dom::element_type::OBJECT: return "an object";
      case simdjson::dom::element_type::INT64:
      case simdjson::dom::element_type::UINT64:
      case simdjson::dom::element_type::DOUBLE: return "a number";
      case simdjson::dom::element_type::STRING: return "a string";
      case simdjson::dom::element_type::BOOL: return "a boolean";
      case simdjson::dom::element_type::NULL_VALUE: return "null";
    }
    return "a value";
  }

  // Whether a JSON value can be a union branch of this schema (the plain
  // JSON an application writes, not Avro's {"type": value} wrapping).
  static bool fits(avro_schema_t s, simdjson::dom::element j) {
    s = resolve(s);
    using T = simdjson::dom::element_type;
    const T t = j.type();
    switch (avro_typeof(s)) {
      case AVRO_NULL: return t == T::NULL_VALUE;
      case AVRO_BOOLEAN: return t == T::BOOL;
      case AVRO_INT32: {
        int64_t v;
        return t == T::INT64 && !j.get_int64().get(v) && v >= std::numeric_limits<int32_t>::min() &&
               v <= std::numeric_limits<int32_t>::max();
      }
      case AVRO_INT64: return t == T::INT64;
      case AVRO_FLOAT:
      case AVRO_DOUBLE: return t == T::INT64 || t == T::UINT64 || t == T::DOUBLE;
      case AVRO_STRING:
      case AVRO_BYTES: return t == T::STRING;
      case AVRO_ENUM: {
        std::string_view v;
        return t == T::STRING && !j.get_string().get(v) &&
               avro_schema_enum_get_by_name(s, std::string(v).c_str()) >= 0;
      }
      case AVRO_FIXED: {
        std::string_view v;
        return t == T::STRING && !j.get_string().get(v);
      }
      case AVRO_ARRAY: return t == T::ARRAY;
      case AVRO_MAP:
      case AVRO_RECORD: return t == T::OBJECT;
      default: return false;
    }
  }

  // The name a union branch is known by in Avro's JSON encoding.
  static std::string branch_name(avro_schema_t s) {
    s = resolve(s);
    switch (avro_typeof(s)) {
      case AVRO_RECORD:
      case AVRO_ENUM:
      case AVRO_FIXED: {
        const char* ns = avro_schema_namespace(s);
        const std::string name = avro_schema_type_name(s);
        return ns && *ns ? std::string(ns) + "." + name : name;
      }
      default: return avro_schema_type_name(s);
    }
  }

  // Avro's bytes and fixed in JSON: each character one byte (ISO-8859-1).
  static std::optional<std::string> latin1(std::string_view utf8) {
    std::string out;
    for (std::size_t i = 0; i < utf8.size(); ++i) {
      auto c = static_cast<unsigned char>(utf8[i]);
      if (c < 0x80) {
        out += static_cast<char>(c);
      } else if ((c & 0xE0) == 0xC0 && i + 1 < utf8.size() && c <= 0xC3) {
        out += static_cast<char>(((c & 0x1F) << 6) | (static_cast<unsigned char>(utf8[++i]) & 0x3F));
      } else {
        return std::nullopt;
      }
    }
    return out;
  }

  std::optional<MapError> fill(avro_value_t& v, avro_schema_t s, simdjson::dom::element j) {
    s = resolve(s);
    using T = simdjson::dom::element_type;
    auto expected = [&](const char* what) {
      return mismatch(path_, std::string("expected ") + what + ", got " + json_kind(j));
    };
    switch (avro_typeof(s)) {
      case AVRO_NULL:
        if (!j.is_null()) return expected("null");
        avro_value_set_null(&v);
        return std::nullopt;
      case AVRO_BOOLEAN: {
        bool b;
        if (j.get_bool().get(b)) return expected("a boolean");
        avro_value_set_boolean(&v, b);
        return std::nullopt;
      }
      case AVRO_INT32: {
        int64_t n;
        if (j.get_int64().get(n)) return expected("an integer (int)");
        if (n < std::numeric_limits<int32_t>::min() || n > std::numeric_limits<int32_t>::max())
          return mismatch(path_, std::to_string(n) + " does not fit an int (32 bits)");
        avro_value_set_int(&v, static_cast<int32_t>(n));
        return std::nullopt;
      }
      case AVRO_INT64: {
        int64_t n;
        if (j.get_int64().get(n)) return expected("an integer (long)");
        avro_value_set_long(&v, n);
        return std::nullopt;
      }
      case AVRO_FLOAT:
      case AVRO_DOUBLE: {
        double d;
        if (j.type() == T::INT64) d = static_cast<double>(int64_t(j));
        else if (j.type() == T::UINT64) d = static_cast<double>(uint64_t(j));
        else if (j.get_double().get(d)) return expected("a number");
        if (avro_typeof(s) == AVRO_FLOAT) avro_value_set_float(&v, static_cast<float>(d));
        else avro_value_set_double(&v, d);
        return std::nullopt;
      }
      case AVRO_STRING: {
        std::string_view str;
        if (j.get_string().get(str)) return expected("a string");
        scratch_.assign(str);
        avro_value_set_string_len(&v, scratch_.c_str(), scratch_.size() + 1);
        return std::nullopt;
      }
      case AVRO_BYTES:
      case AVRO_FIXED: {
        std::string_view str;
        if (j.get_string().get(str)) return expected("a string (Avro's JSON form of bytes)");
        auto bytes = latin1(str);
        if (!bytes) return mismatch(path_, "bytes must be characters U+0000 to U+00FF, one per byte");
        if (avro_typeof(s) == AVRO_FIXED) {
          const auto size = avro_schema_fixed_size(s);
          if (static_cast<int64_t>(bytes->size()) != size)
            return mismatch(path_, "fixed " + branch_name(s) + " takes " + std::to_string(size) + " bytes, got " +
                                       std::to_string(bytes->size()));
          avro_value_set_fixed(&v, bytes->data(), bytes->size());
        } else {
          avro_value_set_bytes(&v, bytes->data(), bytes->size());
        }
        return std::nullopt;
      }
      case AVRO_ENUM: {
        std::string_view str;
        if (j.get_string().get(str)) return expected("a string (an enum symbol)");
        scratch_.assign(str);
        int symbol = avro_schema_enum_get_by_name(s, scratch_.c_str());
        if (symbol < 0) return mismatch(path_, "\"" + scratch_ + "\" is not a symbol of enum " + branch_name(s));
        avro_value_set_enum(&v, symbol);
        return std::nullopt;
      }
      case AVRO_ARRAY: {
        simdjson::dom::array a;
        if (j.get_array().get(a)) return expected("an array");
        const auto items = avro_schema_array_items(s);
        const auto depth = path_.size();
        std::size_t i = 0;
        for (auto item : a) {
          avro_value_t child;
          avro_value_append(&v, &child, nullptr);
          path_ += '/';
          path_ += std::to_string(i++);
          if (auto e = fill(child, items, item)) return e;
          path_.resize(depth);
        }
        return std::nullopt;
      }
      case AVRO_MAP: {
        simdjson::dom::object o;
        if (j.get_object().get(o)) return expected("an object (a map)");
        const auto values = avro_schema_map_values(s);
        const auto depth = path_.size();
        for (auto field : o) {
          avro_value_t child;
          scratch_.assign(field.key);
          avro_value_add(&v, scratch_.c_str(), &child, nullptr, nullptr);
          path_ += '/';
          path_ += scratch_;
          if (auto e = fill(child, values, field.value)) return e;
          path_.resize(depth);
        }
        return std::nullopt;
      }
      case AVRO_RECORD: {
        simdjson::dom::object o;
        if (j.get_object().get(o)) return expected(("an object (record " + branch_name(s) + ")").c_str());
        const auto depth = path_.size();
        const auto fields = avro_schema_record_size(s);
        std::size_t matched = 0;
        for (std::size_t i = 0; i < fields; ++i) {
          const char* name = avro_schema_record_field_name(s, static_cast<int>(i));
          avro_value_t child;
          avro_value_get_by_index(&v, i, &child, nullptr);
          const auto field_schema = avro_schema_record_field_get_by_index(s, static_cast<int>(i));
          path_ += "/";
          path_ += name;
          simdjson::dom::element member;
          if (!o.at_key(name).get(member)) {
            ++matched;
            if (auto e = fill(child, field_schema, member)) return e;
          } else if (auto d = defaults_.find(std::string(avro_schema_type_name(s)) + "\n" + name); d != defaults_.end()) {
            // A default is parsed where it is used (a parser of its own: j's is in use).
            simdjson::dom::element dv;
            if (default_parser_.parse(d->second).get(dv))
              return mismatch(path_, "the schema's default is not JSON");
            if (auto e = fill(child, field_schema, dv)) return e;
          } else {
            return mismatch(path_, "the field is missing and the schema gives it no default");
          }
          path_.resize(depth);
        }
        if (matched < o.size()) {
          for (auto field : o) {
            bool known = false;
            for (std::size_t i = 0; i < fields && !known; ++i)
              known = field.key == avro_schema_record_field_name(s, static_cast<int>(i));
            if (!known) return mismatch(path_ + "/" + std::string(field.key), "record " + branch_name(s) + " has no such field");
          }
        }
        return std::nullopt;
      }
      case AVRO_UNION: {
        const auto branches = avro_schema_union_size(s);
        // Avro's JSON encoding of a union, {"<branch name>": value}, is taken too.
        simdjson::dom::object o;
        if (!j.get_object().get(o) && o.size() == 1) {
          auto field = *o.begin();
          for (std::size_t i = 0; i < branches; ++i) {
            auto b = avro_schema_union_branch(s, static_cast<int>(i));
            if (branch_name(b) == field.key && avro_typeof(resolve(b)) != AVRO_MAP) {
              avro_value_t branch;
              avro_value_set_branch(&v, static_cast<int>(i), &branch);
              return fill(branch, b, field.value);
            }
          }
        }
        for (std::size_t i = 0; i < branches; ++i) {
          auto b = avro_schema_union_branch(s, static_cast<int>(i));
          if (!fits(b, j)) continue;
          avro_value_t branch;
          avro_value_set_branch(&v, static_cast<int>(i), &branch);
          return fill(branch, b, j);
        }
        std::string names;
        for (std::size_t i = 0; i < branches; ++i)
          names += (i ? ", " : "") + branch_name(avro_schema_union_branch(s, static_cast<int>(i)));
        return mismatch(path_, std::string(json_kind(j)) + " fits none of the union's types (" + names + ")");
      }
      default:
        return mismatch(path_, "an Avro type walrelay does not encode");
    }
  }

  avro_schema_t schema_ = nullptr;
  avro_value_iface_t* iface_ = nullptr;
  avro_value_t value_{};
  avro_writer_t writer_ = nullptr;
  simdjson::dom::parser parser_, default_parser_;
  std::string padded_, scratch_, path_;
  std::map<std::string, std::string> defaults_;  // "record\nfield" -> the default's JSON
};

// ---------------------------------------------------------------- JSON Schema

// The payload is written as it is, once it validates (Confluent's JSON
// Schema serializer writes the JSON text after the frame).
class JsonSchemaCodec final : public SchemaCodec {
 public:
  explicit JsonSchemaCodec(const RegisteredSchema& registered) {
    rapidjson::Document d;
    d.Parse(registered.text.data(), registered.text.size());
    if (d.HasParseError())
      throw RegistryError("bad_schema", "subject \"" + registered.subject + "\" schema id " +
                                            std::to_string(registered.id) + " is not JSON: " +
                                            rapidjson::GetParseError_En(d.GetParseError()));
    schema_ = std::make_unique<rapidjson::SchemaDocument>(d);
    validator_.emplace(*schema_);
  }

  std::optional<MapError> encode(std::string_view json, std::string& out) override {
    // RapidJSON's pool allocator never frees what a parse took: each record
    // gets a document over the same pool, emptied after it, so that memory
    // stays the size of the largest payload rather than of all of them.
    struct ClearPool {
      rapidjson::MemoryPoolAllocator<>& pool;
      ~ClearPool() { pool.Clear(); }
    } clear{pool_};
    rapidjson::Document document(&pool_);
    document.Parse(json.data(), json.size());
    if (document.HasParseError())
      return MapError{"bad_content", std::string("the payload is not JSON: ") +
                                         rapidjson::GetParseError_En(document.GetParseError()) + " at byte " +
                                         std::to_string(document.GetErrorOffset())};
    // (The validator's state is malloc'd and freed: one validator serves all.)
    auto& validator = *validator_;
    validator.Reset();
    if (!document.Accept(validator)) {
      rapidjson::StringBuffer where, rule;
      validator.GetInvalidDocumentPointer().StringifyUriFragment(where);
      validator.GetInvalidSchemaPointer().StringifyUriFragment(rule);
      std::string at = where.GetString();
      if (!at.empty() && at[0] == '#') at.erase(0, 1);
      return mismatch(at, std::string("fails \"") + validator.GetInvalidSchemaKeyword() + "\" (schema " +
                              rule.GetString() + ")");
    }
    out.append(json);
    return std::nullopt;
  }

 private:
  std::unique_ptr<rapidjson::SchemaDocument> schema_;
  std::optional<rapidjson::SchemaValidator> validator_;
  rapidjson::MemoryPoolAllocator<> pool_;  // the documents' memory
};

// ---------------------------------------------------------------- Protobuf

class ProtobufErrors final : public google::protobuf::io::ErrorCollector,
                             public google::protobuf::DescriptorPool::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (text.empty()) text = "line " + std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  void AddError(const std::string& filename, const std::string& element_name, const google::protobuf::Message*,
                ErrorLocation, const std::string& message) override {
    (void)filename;
    if (text.empty()) text = element_name + ": " + message;
  }
  std::string text;
};

// The registered .proto text is parsed at run time; the encoded message is
// its first top-level message (the index path [0]).
class ProtobufCodec final : public SchemaCodec {
 public:
  explicit ProtobufCodec(const RegisteredSchema& registered)
      // Google's well-known types (timestamp.proto, ...) come from the pool
      // compiled into libprotobuf, underneath the registered file.
      : pool_(google::protobuf::DescriptorPool::generated_pool()) {
    namespace pb = google::protobuf;
    const std::string what = "subject \"" + registered.subject + "\" schema id " + std::to_string(registered.id);
    pb::io::ArrayInputStream in(registered.text.data(), static_cast<int>(registered.text.size()));
    ProtobufErrors errors;
    pb::io::Tokenizer tokenizer(&in, &errors);
    pb::compiler::Parser parser;
    parser.RecordErrorsTo(&errors);
    pb::FileDescriptorProto file;
    if (!parser.Parse(&tokenizer, &file))
      throw RegistryError("bad_schema", what + " is not a .proto that libprotobuf reads: " + errors.text);
    file.set_name(registered.subject + ".proto");
    // Imports other than Google's well-known types would be schema references.
    const pb::FileDescriptor* built = pool_.BuildFileCollectingErrors(file, &errors);
    if (!built) throw RegistryError("bad_schema", what + " does not build: " + errors.text);
    if (built->message_type_count() == 0) throw RegistryError("bad_schema", what + " declares no message");
    descriptor_ = built->message_type(0);
    message_.reset(factory_.GetPrototype(descriptor_)->New());
    options_.ignore_unknown_fields = false;
  }

  std::optional<MapError> encode(std::string_view json, std::string& out) override {
    message_->Clear();
    auto status = google::protobuf::util::JsonStringToMessage(
        google::protobuf::StringPiece(json.data(), json.size()), message_.get(), options_);
    if (!status.ok())
      return MapError{"schema_mismatch", "the payload does not fit message " + descriptor_->full_name() + ": " +
                                             std::string(status.message())};
    message_->AppendToString(&out);
    return std::nullopt;
  }

 private:
  google::protobuf::DescriptorPool pool_;
  google::protobuf::DynamicMessageFactory factory_;
  const google::protobuf::Descriptor* descriptor_ = nullptr;
  std::unique_ptr<google::protobuf::Message> message_;
  google::protobuf::util::JsonParseOptions options_;
};

}  // namespace

std::unique_ptr<SchemaCodec> make_schema_codec(RegistryFormat format, const RegisteredSchema& schema) {
  static const std::map<RegistryFormat, std::string> types = {
      {RegistryFormat::avro, "AVRO"}, {RegistryFormat::json_schema, "JSON"}, {RegistryFormat::protobuf, "PROTOBUF"}};
  const std::string& want = types.at(format);
  if (schema.type != want)
    throw RegistryError("bad_schema", "subject \"" + schema.subject + "\" holds a " + schema.type +
                                          " schema (id " + std::to_string(schema.id) + "), and value.converter=" +
                                          registry_converter_name(format) + " encodes " + want);
  if (schema.references)
    throw RegistryError("bad_schema", "subject \"" + schema.subject + "\" schema id " + std::to_string(schema.id) +
                                          " refers to other schemas, which walrelay does not resolve yet: register "
                                          "it self-contained");
  switch (format) {
    case RegistryFormat::avro: return std::make_unique<AvroCodec>(schema);
    case RegistryFormat::json_schema: return std::make_unique<JsonSchemaCodec>(schema);
    case RegistryFormat::protobuf: return std::make_unique<ProtobufCodec>(schema);
    case RegistryFormat::none: break;
  }
  throw RegistryError("bad_schema", "no schema format");
}

}  // namespace walrelay
