// Embeds a source-tree file in the binary at build time (.incbin), so the program needs no
// assets folder. In one .cc file:
//   ASTRAI_EMBED_FILE(astrai_serve_web_index, "src/serve/web/index.html")
//   ... std::string_view page = ASTRAI_EMBEDDED(astrai_serve_web_index);
// and in src/CMakeLists.txt make that object depend on the file (OBJECT_DEPENDS), or an edit
// of it does not rebuild. The bytes end with one NUL (not part of the view).
#pragma once

#include <cstddef>
#include <string_view>

#ifndef ASTRAI_SOURCE_DIR
#error "ASTRAI_SOURCE_DIR must name the source tree (set by src/CMakeLists.txt)"
#endif

#define ASTRAI_EMBED_FILE(name, path)                     \
  asm(".section .rodata\n"                                \
      ".balign 16\n" #name "_begin:\n"                    \
      ".incbin \"" ASTRAI_SOURCE_DIR "/" path "\"\n"      \
      #name "_end:\n"                                     \
      ".byte 0\n"                                         \
      ".previous\n"                                       \
      ".set " #name "_begin_ref, " #name "_begin\n"       \
      ".set " #name "_end_ref, " #name "_end\n");         \
  extern "C" const char name##_begin_ref[];               \
  extern "C" const char name##_end_ref[]

#define ASTRAI_EMBEDDED(name) \
  std::string_view(name##_begin_ref, static_cast<std::size_t>(name##_end_ref - name##_begin_ref))
