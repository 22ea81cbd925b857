# Warnings used for every target of the project (not for consumers). CI's builds make them
# errors (KVOFFLOAD_WERROR, set by the presets that inherit "warnings-as-errors").
option(KVOFFLOAD_WERROR "Treat compiler warnings as errors" OFF)
function(kvoffload_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>)
  if(KVOFFLOAD_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()
