// The chat page is src/serve/web/index.html, embedded at build time (.incbin) so the binary
// needs no assets folder; src/CMakeLists.txt makes this object depend on the file.
#include <string_view>

#include "serve/server.h"

#ifndef ASTRAI_SOURCE_DIR
#error "ASTRAI_SOURCE_DIR must name the source tree (set by src/CMakeLists.txt)"
#endif

asm(".section .rodata\n"
    ".balign 16\n"
    "astrai_serve_web_index_begin:\n"
    ".incbin \"" ASTRAI_SOURCE_DIR "/src/serve/web/index.html\"\n"
    "astrai_serve_web_index_end:\n"
    ".byte 0\n"
    ".previous\n"
    ".set astrai_serve_web_index_begin_ref, astrai_serve_web_index_begin\n"
    ".set astrai_serve_web_index_end_ref, astrai_serve_web_index_end\n");

extern "C" const char astrai_serve_web_index_begin_ref[];
extern "C" const char astrai_serve_web_index_end_ref[];

namespace astrai::serve {

std::string_view web_page() {
  return std::string_view(astrai_serve_web_index_begin_ref,
                          static_cast<size_t>(astrai_serve_web_index_end_ref - astrai_serve_web_index_begin_ref));
}

}  // namespace astrai::serve
