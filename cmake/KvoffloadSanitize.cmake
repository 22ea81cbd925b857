# KVOFFLOAD_SANITIZE=address|thread builds every target with AddressSanitizer and
# UndefinedBehaviorSanitizer, or ThreadSanitizer (presets asan and tsan; scripts/test runs
# both). CUDA stays off in these builds. Any sanitizer report fails the test that caused it.
set(KVOFFLOAD_SANITIZE "" CACHE STRING "Sanitizer build: address (ASan+UBSan), thread (TSan), fuzzer (clang: libFuzzer+ASan+UBSan) or empty")
set_property(CACHE KVOFFLOAD_SANITIZE PROPERTY STRINGS "" address thread fuzzer)
if(KVOFFLOAD_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
elseif(KVOFFLOAD_SANITIZE STREQUAL "fuzzer")
  # clang only: coverage for libFuzzer plus ASan and UBSan (the fuzz targets add -fsanitize=fuzzer).
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
elseif(KVOFFLOAD_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT KVOFFLOAD_SANITIZE STREQUAL "")
  message(FATAL_ERROR "KVOFFLOAD_SANITIZE is \"${KVOFFLOAD_SANITIZE}\" (address, thread, fuzzer or empty)")
endif()
