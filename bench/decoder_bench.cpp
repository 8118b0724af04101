// Benchmarks for the pgoutput decoder: a realistic outbox Insert, the same
// inside an XLogData envelope, and whole captured streams; and for the
// mapper that turns a decoded outbox Insert into a Kafka record, in text and
// binary mode. Heap allocations are counted with a replaced global operator
// new and reported per message.
//
//   decoder_bench [--benchmark_filter=...]
// Golden vectors are read from PGOUTPUT_GOLDEN_DIR (compile definition), or
// from the directory in the environment variable of the same name.
#include <pgoutput/pgoutput.hpp>

#include <benchmark/benchmark.h>

#include "walrelay/config.hpp"
#include "walrelay/route/outbox_mapper.hpp"

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#ifndef PGOUTPUT_GOLDEN_DIR
#define PGOUTPUT_GOLDEN_DIR "tests/golden"
#endif

namespace {
std::atomic<long> g_allocations{0};  // heap allocations since start

// Out of line so GCC does not pair the inlined operator new with free()
// (-Wmismatched-new-delete false positive).
[[gnu::noinline]] void release(void* p) noexcept { std::free(p); }
}  // namespace

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }

namespace {

using ByteVec = std::vector<std::byte>;

void put_u8(ByteVec& b, std::uint8_t v) { b.push_back(static_cast<std::byte>(v)); }
void put_u16(ByteVec& b, std::uint16_t v) {
  put_u8(b, static_cast<std::uint8_t>(v >> 8));
  put_u8(b, static_cast<std::uint8_t>(v));
}
void put_u32(ByteVec& b, std::uint32_t v) {
  put_u16(b, static_cast<std::uint16_t>(v >> 16));
  put_u16(b, static_cast<std::uint16_t>(v));
}
void put_text(ByteVec& b, const std::string& s, char kind = 't') {
  put_u8(b, static_cast<std::uint8_t>(kind));
  put_u32(b, static_cast<std::uint32_t>(s.size()));
  for (char c : s) put_u8(b, static_cast<std::uint8_t>(c));
}
void put_cstr(ByteVec& b, const std::string& s) {
  for (char c : s) put_u8(b, static_cast<std::uint8_t>(c));
  put_u8(b, 0);
}

// The 200-byte JSON payload of the outbox rows below.
std::string outbox_payload() {
  std::string payload =
      R"({"orderId":"order-1001","customerId":"cust-42","lines":[{"sku":"sku-1","qty":2,"price":"19.99"},)"
      R"({"sku":"sku-2","qty":1,"price":"5.00"}],"currency":"EUR","total":"44.98","note":")";
  payload.append(200 - payload.size() - 2, 'x');
  payload += "\"}";
  return payload;
}

// An Insert into an outbox table: uuid id, aggregatetype, aggregateid, type,
// a 200-byte JSON payload and a timestamp, all in text format.
ByteVec outbox_insert() {
  const std::string payload = outbox_payload();
  ByteVec b;
  put_u8(b, 'I');
  put_u32(b, 16439);
  put_u8(b, 'N');
  put_u16(b, 6);
  put_text(b, "5f0c6f9e-2c5b-4b8e-9a55-0c7c2f1f4a11");
  put_text(b, "order");
  put_text(b, "order-1001");
  put_text(b, "OrderCreated");
  put_text(b, payload);
  put_text(b, "2024-01-02 03:04:05.123456+00");
  return b;
}

// What a consumer does with a decoded Insert: look at every column.
std::size_t consume(const pgoutput::Message& m) {
  std::size_t n = 0;
  if (const auto* ins = std::get_if<pgoutput::Insert>(&m)) {
    for (const pgoutput::Column& c : ins->new_tuple) n += c.data.size() + static_cast<std::size_t>(c.kind);
  }
  return n;
}

void report_allocations(benchmark::State& state, long before) {
  const long allocations = g_allocations.load() - before;
  state.counters["allocs_per_msg"] = benchmark::Counter(
      static_cast<double>(allocations), benchmark::Counter::kAvgIterations);
}

void BM_DecodeOutboxInsert(benchmark::State& state) {
  const ByteVec msg = outbox_insert();
  const pgoutput::DecodeContext ctx{1, false, {}};
  if (!pgoutput::decode(msg, ctx)) {
    state.SkipWithError("outbox insert does not decode");
    return;
  }
  const long before = g_allocations.load();
  for (auto _ : state) {
    auto r = pgoutput::decode(msg, ctx);
    benchmark::DoNotOptimize(consume(*r));
  }
  report_allocations(state, before);
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(msg.size()));
}
BENCHMARK(BM_DecodeOutboxInsert);

void BM_DecodeEnvelopeOutboxInsert(benchmark::State& state) {
  ByteVec msg(25, std::byte{0});
  msg[0] = static_cast<std::byte>('w');
  const ByteVec insert = outbox_insert();
  msg.insert(msg.end(), insert.begin(), insert.end());
  pgoutput::Decoder decoder(1);
  const long before = g_allocations.load();
  for (auto _ : state) {
    auto env = pgoutput::decode_replication_message(msg);
    auto r = decoder.decode(std::get<pgoutput::XLogData>(*env).payload);
    benchmark::DoNotOptimize(consume(*r));
  }
  report_allocations(state, before);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_DecodeEnvelopeOutboxInsert);

// The Relation message of the outbox table of outbox_insert(): Debezium's
// default columns plus a timestamptz created_at; payload of the given type.
ByteVec outbox_relation(std::uint32_t payload_type) {
  const std::pair<const char*, std::uint32_t> columns[] = {
      {"id", walrelay::pgtype::uuid},          {"aggregatetype", walrelay::pgtype::varchar},
      {"aggregateid", walrelay::pgtype::text}, {"type", walrelay::pgtype::text},
      {"payload", payload_type},               {"created_at", walrelay::pgtype::timestamptz}};
  ByteVec b;
  put_u8(b, 'R');
  put_u32(b, 16439);
  put_cstr(b, "public");
  put_cstr(b, "outbox");
  put_u8(b, 'd');
  put_u16(b, 6);
  for (const auto& [name, type] : columns) {
    put_u8(b, 0);
    put_cstr(b, name);
    put_u32(b, type);
    put_u32(b, 0xFFFFFFFF);
  }
  return b;
}

// outbox_insert() as pgoutput sends it with binary = true: each column in
// its type's send format.
ByteVec outbox_insert_binary() {
  const std::string uuid("\x5f\x0c\x6f\x9e\x2c\x5b\x4b\x8e\x9a\x55\x0c\x7c\x2f\x1f\x4a\x11", 16);
  // 2024-01-02 03:04:05.123456+00 in microseconds since 2000-01-01.
  const std::uint64_t micros = 757479845123456ULL;
  std::string timestamp;
  for (int shift = 56; shift >= 0; shift -= 8) timestamp.push_back(static_cast<char>(micros >> shift));
  ByteVec b;
  put_u8(b, 'I');
  put_u32(b, 16439);
  put_u8(b, 'N');
  put_u16(b, 6);
  put_text(b, uuid, 'b');
  put_text(b, "order", 'b');
  put_text(b, "order-1001", 'b');
  put_text(b, "OrderCreated", 'b');
  put_text(b, "\x01" + outbox_payload(), 'b');
  put_text(b, timestamp, 'b');
  return b;
}

// outbox_insert() with the payload as bytea in its hex text form.
ByteVec outbox_insert_bytea() {
  std::string hex = "\\x";
  for (unsigned char c : outbox_payload()) {
    hex.push_back("0123456789abcdef"[c >> 4]);
    hex.push_back("0123456789abcdef"[c & 15]);
  }
  ByteVec b;
  put_u8(b, 'I');
  put_u32(b, 16439);
  put_u8(b, 'N');
  put_u16(b, 6);
  put_text(b, "5f0c6f9e-2c5b-4b8e-9a55-0c7c2f1f4a11");
  put_text(b, "order");
  put_text(b, "order-1001");
  put_text(b, "OrderCreated");
  put_text(b, hex);
  put_text(b, "2024-01-02 03:04:05.123456+00");
  return b;
}

// Maps one decoded outbox Insert per iteration: Debezium's default routing
// and key, the timestamp taken from created_at.
void BM_MapOutboxInsert(benchmark::State& state, std::uint32_t payload_type, const ByteVec& insert) {
  const walrelay::Config config =
      walrelay::parse_config("kafka.bootstrap.servers=x:1\ntable.field.event.timestamp=created_at\n", "bench", {});
  walrelay::OutboxMapper mapper(config);
  const ByteVec relation = outbox_relation(payload_type);
  const pgoutput::DecodeContext ctx{1, false, {}};
  auto rel = pgoutput::decode(relation, ctx);
  auto ins = pgoutput::decode(insert, ctx);
  if (!rel || !ins) {
    state.SkipWithError("outbox messages do not decode");
    return;
  }
  mapper.on_relation(std::get<pgoutput::Relation>(*rel));
  const auto& row = std::get<pgoutput::Insert>(*ins);
  walrelay::OutboxRecord record;
  if (auto e = mapper.map(row, 0, record)) {
    state.SkipWithError(("outbox row does not map: " + e->message).c_str());
    return;
  }
  const long before = g_allocations.load();
  for (auto _ : state) {
    auto e = mapper.map(row, 0, record);
    benchmark::DoNotOptimize(e);
    benchmark::DoNotOptimize(record.timestamp_ms);
  }
  report_allocations(state, before);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK_CAPTURE(BM_MapOutboxInsert, text, walrelay::pgtype::jsonb, outbox_insert());
BENCHMARK_CAPTURE(BM_MapOutboxInsert, binary, walrelay::pgtype::jsonb, outbox_insert_binary());
BENCHMARK_CAPTURE(BM_MapOutboxInsert, text_bytea, walrelay::pgtype::bytea, outbox_insert_bytea());

// Loads tests/golden/<name>.hex (one hex message per line).
std::vector<ByteVec> load_golden(const std::string& name) {
  const char* env = std::getenv("PGOUTPUT_GOLDEN_DIR");
  const std::string path = std::string(env != nullptr ? env : PGOUTPUT_GOLDEN_DIR) + "/" + name + ".hex";
  std::ifstream in(path);
  std::vector<ByteVec> out;
  std::string line;
  auto digit = [](char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
  while (std::getline(in, line)) {
    ByteVec v;
    for (std::size_t i = 0; i + 1 < line.size(); i += 2) {
      v.push_back(static_cast<std::byte>(digit(line[i]) * 16 + digit(line[i + 1])));
    }
    if (!v.empty()) out.push_back(std::move(v));
  }
  return out;
}

// Decodes a whole captured stream per iteration; items are messages.
void BM_DecodeCapturedStream(benchmark::State& state, const std::string& name, int proto_version) {
  const std::vector<ByteVec> msgs = load_golden(name);
  if (msgs.empty()) {
    state.SkipWithError("golden vectors not found; set PGOUTPUT_GOLDEN_DIR");
    return;
  }
  std::int64_t bytes = 0;
  for (const auto& m : msgs) bytes += static_cast<std::int64_t>(m.size());
  const long before = g_allocations.load();
  long failures = 0;
  for (auto _ : state) {
    pgoutput::Decoder decoder(proto_version);
    for (const auto& m : msgs) {
      auto r = decoder.decode(m);
      if (!r) {
        ++failures;
        continue;
      }
      benchmark::DoNotOptimize(consume(*r));
    }
  }
  const long allocations = g_allocations.load() - before;
  if (failures != 0) state.SkipWithError("a golden message failed to decode");
  state.counters["allocs_per_msg"] = static_cast<double>(allocations) /
                                     static_cast<double>(state.iterations() * static_cast<std::int64_t>(msgs.size()));
  state.counters["msgs"] = static_cast<double>(msgs.size());
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(msgs.size()));
  state.SetBytesProcessed(state.iterations() * bytes);
}
BENCHMARK_CAPTURE(BM_DecodeCapturedStream, v2_stream, std::string("v2_stream"), 2);
BENCHMARK_CAPTURE(BM_DecodeCapturedStream, v1_dml, std::string("v1_dml"), 1);
BENCHMARK_CAPTURE(BM_DecodeCapturedStream, v1_many_columns, std::string("v1_many_columns"), 1);

}  // namespace

BENCHMARK_MAIN();
