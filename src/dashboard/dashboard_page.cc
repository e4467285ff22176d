// The dashboard page is src/dashboard/web/dashboard.html, embedded at build time
// (base/embed_file.h); src/CMakeLists.txt makes this object depend on the file.
#include "base/embed_file.h"
#include "dashboard/dashboard_server.h"

ASTRAI_EMBED_FILE(astrai_dashboard_page, "src/dashboard/web/dashboard.html");

namespace astrai::dashboard {

std::string_view dashboard_page() { return ASTRAI_EMBEDDED(astrai_dashboard_page); }

}  // namespace astrai::dashboard
