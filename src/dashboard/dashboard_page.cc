// The dashboard page is src/dashboard/web/dashboard.html, embedded at build time (.incbin) so
// the binary needs no assets folder; src/CMakeLists.txt makes this object depend on the file.
#include <string_view>

#include "dashboard/dashboard_server.h"

#ifndef ASTRAI_SOURCE_DIR
#error "ASTRAI_SOURCE_DIR must name the source tree (set by src/CMakeLists.txt)"
#endif

asm(".section .rodata\n"
    ".balign 16\n"
    "astrai_dashboard_page_begin:\n"
    ".incbin \"" ASTRAI_SOURCE_DIR "/src/dashboard/web/dashboard.html\"\n"
    "astrai_dashboard_page_end:\n"
    ".byte 0\n"
    ".previous\n"
    ".set astrai_dashboard_page_begin_ref, astrai_dashboard_page_begin\n"
    ".set astrai_dashboard_page_end_ref, astrai_dashboard_page_end\n");

extern "C" const char astrai_dashboard_page_begin_ref[];
extern "C" const char astrai_dashboard_page_end_ref[];

namespace astrai::dashboard {

std::string_view dashboard_page() {
  return std::string_view(astrai_dashboard_page_begin_ref,
                          static_cast<size_t>(astrai_dashboard_page_end_ref - astrai_dashboard_page_begin_ref));
}

}  // namespace astrai::dashboard
