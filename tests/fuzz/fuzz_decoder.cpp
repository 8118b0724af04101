// libFuzzer target for the pgoutput decoder.
//
// The first input byte chooses how the rest is decoded:
//   bits 0-1  proto_version - 1
//   bit  2    in_streamed_transaction
//   bits 3-4  stream_abort_has_lsn: 1 = false, 2 = true, else unset
//   bit  5    the rest is a CopyData envelope ('w'/'k'); an XLogData payload is then decoded
//   bit  6    the rest is a sequence of [UInt16 length][message] fed to one Decoder
// Successful decodes are walked completely and every view is checked to lie
// inside the input, so a wrong bounds check shows up as a trap or an ASan report.
#include <pgoutput/binary.hpp>
#include <pgoutput/pgoutput.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

using namespace pgoutput;

namespace {

// Traps unless `inner` lies within `outer`.
void check_inside(Bytes inner, Bytes outer) {
  if (inner.empty()) return;
  const auto* b = outer.data();
  const auto* e = outer.data() + outer.size();
  if (inner.data() < b || inner.data() + inner.size() > e) __builtin_trap();
}

void check_inside(std::string_view s, Bytes outer) { check_inside(as_bytes(s), outer); }

// Reads a value with every binary send format reader: each must refuse a
// wrong length rather than read past the value.
unsigned read_binary(Bytes value, Bytes outer) {
  unsigned sum = 0;
  if (auto v = binary::to_bool(value)) sum += *v ? 1U : 0U;
  if (auto v = binary::to_int16(value)) sum += static_cast<unsigned>(*v);
  if (auto v = binary::to_int32(value)) sum += static_cast<unsigned>(*v);
  if (auto v = binary::to_oid(value)) sum += *v;
  if (auto v = binary::to_int64(value)) sum += static_cast<unsigned>(*v);
  if (auto v = binary::to_timestamp(value)) sum += static_cast<unsigned>(*v);
  if (auto v = binary::to_uuid(value)) sum += (*v)[15];
  if (auto v = binary::to_jsonb_text(value)) {
    check_inside(*v, outer);
    sum += static_cast<unsigned>(v->size());
  }
  return sum;
}

// Walks a tuple, touching every byte of every value.
unsigned walk(const TupleData& t, Bytes outer) {
  unsigned sum = 0;
  std::size_t n = 0;
  for (const Column& c : t) {
    check_inside(c.data, outer);
    for (std::byte b : c.data) sum += std::to_integer<unsigned>(b);
    sum += read_binary(c.data, outer);
    ++n;
  }
  if (n != t.size()) __builtin_trap();
  check_inside(t.raw(), outer);
  return sum;
}

// Walks every field of a decoded message.
unsigned walk(const Message& m, Bytes outer) {
  return std::visit(
      [&](const auto& msg) -> unsigned {
        using T = std::decay_t<decltype(msg)>;
        unsigned sum = 0;
        if constexpr (std::is_same_v<T, Relation>) {
          check_inside(msg.nspname, outer);
          check_inside(msg.relname, outer);
          std::size_t n = 0;
          for (const RelationColumn& c : msg.columns) {
            check_inside(c.name, outer);
            sum += static_cast<unsigned>(c.name.size()) + c.type_oid;
            ++n;
          }
          if (n != msg.columns.size()) __builtin_trap();
        } else if constexpr (std::is_same_v<T, Insert>) {
          sum += walk(msg.new_tuple, outer);
        } else if constexpr (std::is_same_v<T, Update>) {
          if (msg.old_tuple) sum += walk(*msg.old_tuple, outer);
          sum += walk(msg.new_tuple, outer);
        } else if constexpr (std::is_same_v<T, Delete>) {
          sum += walk(msg.old_tuple, outer);
        } else if constexpr (std::is_same_v<T, Truncate>) {
          check_inside(msg.relation_oids, outer);
          if (msg.relation_oids.size() != std::size_t{msg.relation_count} * 4) __builtin_trap();
          for (std::uint32_t i = 0; i < msg.relation_count; ++i) sum += msg.relation_oid(i);
        } else if constexpr (std::is_same_v<T, LogicalMessage>) {
          check_inside(msg.prefix, outer);
          check_inside(msg.content, outer);
        } else if constexpr (std::is_same_v<T, Type>) {
          check_inside(msg.nspname, outer);
          check_inside(msg.typname, outer);
        } else if constexpr (std::is_same_v<T, Origin>) {
          check_inside(msg.name, outer);
        } else if constexpr (requires { msg.gid; }) {
          check_inside(msg.gid, outer);
        }
        return sum;
      },
      m);
}

// Decodes one message and walks it; checks the error offset on failure.
void one(Bytes msg, const DecodeContext& ctx) {
  auto r = decode(msg, ctx);
  if (r) {
    volatile unsigned sink = walk(*r, msg);
    (void)sink;
    (void)message_name(*r);
  } else if (r.error().offset > msg.size() || r.error().detail.empty()) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const Bytes rest(reinterpret_cast<const std::byte*>(data) + 1, size - 1);

  DecodeContext ctx;
  ctx.proto_version = (mode & 3) + 1;
  ctx.in_streamed_transaction = (mode & 4) != 0;
  switch ((mode >> 3) & 3) {
    case 1: ctx.stream_abort_has_lsn = false; break;
    case 2: ctx.stream_abort_has_lsn = true; break;
    default: break;
  }

  if ((mode & 64) != 0) {
    Decoder decoder(ctx);
    Bytes left = rest;
    while (left.size() >= 2) {
      const std::size_t len = (std::to_integer<std::size_t>(left[0]) << 8) | std::to_integer<std::size_t>(left[1]);
      left = left.subspan(2);
      const Bytes msg = left.first(len < left.size() ? len : left.size());
      left = left.subspan(msg.size());
      const bool before = decoder.in_streamed_transaction();
      auto r = decoder.decode(msg);
      if (r) {
        volatile unsigned sink = walk(*r, msg);
        (void)sink;
      } else if (decoder.in_streamed_transaction() != before) {
        __builtin_trap();  // a failed decode must not change the state
      }
    }
    return 0;
  }

  if ((mode & 32) != 0) {
    auto env = decode_replication_message(rest);
    if (env) {
      if (const auto* x = std::get_if<XLogData>(&*env)) {
        check_inside(x->payload, rest);
        one(x->payload, ctx);
      }
    } else if (env.error().offset > rest.size()) {
      __builtin_trap();
    }
    return 0;
  }

  one(rest, ctx);
  return 0;
}
