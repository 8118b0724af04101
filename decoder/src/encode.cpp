#include "pgoutput/encode.hpp"

#include <cstring>

namespace pgoutput {

void MessageWriter::u16(std::uint16_t v) {
  u8(static_cast<std::uint8_t>(v >> 8));
  u8(static_cast<std::uint8_t>(v));
}

void MessageWriter::u32(std::uint32_t v) {
  u16(static_cast<std::uint16_t>(v >> 16));
  u16(static_cast<std::uint16_t>(v));
}

void MessageWriter::cstr(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  buf_.insert(buf_.end(), p, p + s.size());
  u8(0);
}

void MessageWriter::relation(std::uint32_t oid, std::string_view nspname, std::string_view relname,
                             std::span<const ColumnSpec> columns) {
  buf_.clear();
  u8('R');
  u32(oid);
  cstr(nspname);
  cstr(relname);
  u8('d');
  u16(static_cast<std::uint16_t>(columns.size()));
  for (const auto& c : columns) {
    u8(0);
    cstr(c.name);
    u32(c.type_oid);
    u32(static_cast<std::uint32_t>(c.type_modifier));
  }
}

void MessageWriter::insert(std::uint32_t relation_oid, std::uint16_t columns) {
  buf_.clear();
  u8('I');
  u32(relation_oid);
  u8('N');
  u16(columns);
}

void MessageWriter::null() { u8('n'); }

void MessageWriter::text(std::string_view value) {
  u8('t');
  u32(static_cast<std::uint32_t>(value.size()));
  const auto* p = reinterpret_cast<const std::byte*>(value.data());
  buf_.insert(buf_.end(), p, p + value.size());
}

}  // namespace pgoutput
