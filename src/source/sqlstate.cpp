#include "walrelay/source/sqlstate.hpp"

#include <map>

namespace walrelay {

std::string sqlstate_name(const std::string& code) {
  static const std::map<std::string, std::string> names = {
      {"21000", "cardinality_violation"},     {"22001", "string_data_right_truncation"},
      {"22003", "numeric_value_out_of_range"}, {"22007", "invalid_datetime_format"},
      {"22008", "datetime_field_overflow"},   {"22012", "division_by_zero"},
      {"22023", "invalid_parameter_value"},   {"22P02", "invalid_text_representation"},
      {"23514", "check_violation"},           {"25006", "read_only_sql_transaction"},
      {"25000", "invalid_transaction_state"}, {"42501", "insufficient_privilege"},
      {"42P01", "undefined_table"},           {"42703", "undefined_column"},
      {"42704", "undefined_object"},          {"42883", "undefined_function"},
      {"53200", "out_of_memory"},             {"54001", "statement_too_complex"},
      {"55P03", "lock_not_available"},        {"57014", "query_canceled"},
      {"P0001", "raise_exception"},
  };
  auto it = names.find(code);
  return it == names.end() ? std::string() : " " + it->second;
}

bool query_own_error(const std::string& sqlstate) {
  return sqlstate.starts_with("22") || sqlstate.starts_with("42") || sqlstate.starts_with("54");
}

}  // namespace walrelay
