// The system SQLite (Debian libsqlite3-dev), for DatamodeDeferral only (SPEC §18.3).
#include <sqlite3.h>

// SQLITE_TRANSIENT is a macro that casts -1 to a function pointer, which Swift cannot import: SQLite copies a
// value bound with it before sqlite3_bind_* returns.
static inline sqlite3_destructor_type csqlite_transient(void) { return SQLITE_TRANSIENT; }
