// Builds pgoutput Relation and Insert messages, as a walsender would send them
// outside a streamed transaction. The initial snapshot turns the rows it reads
// into these, so that they take the decoder's and the mapper's path, the one
// the stream's rows take. No I/O; the buffer is reused from message to message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace pgoutput {

class MessageWriter {
 public:
  struct ColumnSpec {
    std::string_view name;
    std::uint32_t type_oid;
    std::int32_t type_modifier = -1;
  };

  // 'R': the relation's columns (none marked as key).
  void relation(std::uint32_t oid, std::string_view nspname, std::string_view relname,
                std::span<const ColumnSpec> columns);
  // 'I' with a new tuple of `columns` columns; add each with null() or text().
  void insert(std::uint32_t relation_oid, std::uint16_t columns);
  void null();
  void text(std::string_view value);

  std::span<const std::byte> bytes() const noexcept { return buf_; }

 private:
  void u8(std::uint8_t v) { buf_.push_back(static_cast<std::byte>(v)); }
  void u16(std::uint16_t v);
  void u32(std::uint32_t v);
  void cstr(std::string_view s);
  std::vector<std::byte> buf_;
};

}  // namespace pgoutput
