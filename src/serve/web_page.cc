// The chat page is src/serve/web/index.html, embedded at build time (base/embed_file.h);
// src/CMakeLists.txt makes this object depend on the file.
#include "base/embed_file.h"
#include "serve/server.h"

ASTRAI_EMBED_FILE(astrai_serve_web_index, "src/serve/web/index.html");

namespace astrai::serve {

std::string_view web_page() { return ASTRAI_EMBEDDED(astrai_serve_web_index); }

}  // namespace astrai::serve
