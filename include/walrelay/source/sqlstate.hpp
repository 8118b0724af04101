// SQLSTATEs by name, for the messages that may not quote the server's text
// (an error raised while rows are read may quote what they hold: a failed
// cast quotes the value).
#pragma once

#include <string>

namespace walrelay {

// " division_by_zero" for "22012" (a leading space), "" for a code it does
// not know.
std::string sqlstate_name(const std::string& code);

// Whether an error raised while a query reads rows is the query's own (a
// data exception, a syntax or access error, a program limit): it would come
// again at every try, where a lost connection or a cancel would not.
bool query_own_error(const std::string& sqlstate);

}  // namespace walrelay
