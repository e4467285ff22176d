add_library(astrai_flags INTERFACE)
# -ffp-contract=off: GCC would otherwise fuse a * b + c into one FMA wherever the target has
# FMA, so the same C++ would round differently per CPU level; every fused multiply-add the
# kernels mean is written out (std::fma, vfma).
target_compile_options(astrai_flags INTERFACE
  $<$<COMPILE_LANGUAGE:C,CXX>:-Wall -Wextra -Wno-unused-parameter -ffp-contract=off>)
if(ASTRAI_NATIVE)
  target_compile_options(astrai_flags INTERFACE $<$<COMPILE_LANGUAGE:C,CXX>:-march=native>)
endif()
if(ASTRAI_SANITIZE)
  target_compile_options(astrai_flags INTERFACE -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  target_link_options(astrai_flags INTERFACE -fsanitize=address,undefined)
endif()
if(ASTRAI_TSAN)
  target_compile_options(astrai_flags INTERFACE -fsanitize=thread -fno-omit-frame-pointer)
  target_link_options(astrai_flags INTERFACE -fsanitize=thread)
endif()
