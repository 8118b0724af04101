// Helpers for the decoder tests.
#include "test_support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#ifndef PGOUTPUT_GOLDEN_DIR
#error "PGOUTPUT_GOLDEN_DIR must be defined to the tests/golden directory"
#endif

namespace pgoutput_test {

namespace {
int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

bool unhex(std::string_view hex, ByteVec& out) {
  out.clear();
  if (hex.size() % 2 != 0) return false;
  out.reserve(hex.size() / 2);
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int hi = hex_digit(hex[i]);
    const int lo = hex_digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<std::byte>(hi * 16 + lo));
  }
  return true;
}

std::vector<ByteVec> load_golden(const std::string& name) {
  const std::string path = std::string(PGOUTPUT_GOLDEN_DIR) + "/" + name + ".hex";
  std::ifstream in(path);
  INFO("golden file " << path);
  REQUIRE(in.good());
  std::vector<ByteVec> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    ByteVec v;
    REQUIRE(unhex(line, v));
    out.push_back(std::move(v));
  }
  REQUIRE(!out.empty());
  return out;
}

std::vector<std::string> golden_cases() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(PGOUTPUT_GOLDEN_DIR)) {
    if (e.path().extension() == ".hex") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

int golden_proto_version(const std::string& name) {
  REQUIRE(name.size() > 2);
  REQUIRE(name[0] == 'v');
  return name[1] - '0';
}

DecodedCase decode_golden(const std::string& name) {
  DecodedCase c;
  c.raw = load_golden(name);
  pgoutput::Decoder decoder(golden_proto_version(name));
  for (std::size_t i = 0; i < c.raw.size(); ++i) {
    c.contexts.push_back(decoder.context());
    auto r = decoder.decode(c.raw[i]);
    if (!r) {
      FAIL("could not decode " << name << " message " << i << ": " << pgoutput::to_string(r.error().code) << " at "
                               << r.error().offset << ": " << r.error().detail);
    }
    c.messages.push_back(*r);
  }
  return c;
}

Builder& Builder::u8(std::uint8_t v) {
  b_.push_back(static_cast<std::byte>(v));
  return *this;
}
Builder& Builder::u16(std::uint16_t v) {
  u8(static_cast<std::uint8_t>(v >> 8));
  return u8(static_cast<std::uint8_t>(v));
}
Builder& Builder::u32(std::uint32_t v) {
  u16(static_cast<std::uint16_t>(v >> 16));
  return u16(static_cast<std::uint16_t>(v));
}
Builder& Builder::u64(std::uint64_t v) {
  u32(static_cast<std::uint32_t>(v >> 32));
  return u32(static_cast<std::uint32_t>(v));
}
Builder& Builder::cstr(std::string_view s) {
  raw(s);
  return u8(0);
}
Builder& Builder::raw(std::string_view s) {
  for (char c : s) u8(static_cast<std::uint8_t>(c));
  return *this;
}

std::string column_text(const pgoutput::TupleData& t, std::size_t i) {
  auto c = t.column(i);
  REQUIRE(c.has_value());
  return std::string(c->text());
}

}  // namespace pgoutput_test
