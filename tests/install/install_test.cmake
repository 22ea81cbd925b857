# ctest driver: installs the build tree into a scratch prefix, then builds and runs a consumer
# project against it with find_package, and the C consumer with pkg-config.
#   -DBUILD_DIR=<kvoffload build> -DSOURCE=<tests/install> -DWORK=<scratch dir> -DCC=<c compiler>
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

file(REMOVE_RECURSE ${WORK})
set(prefix ${WORK}/prefix)
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f include/kvoffload/kvoffload.h include/kvoffload/scheduler.hpp)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()

run(${CMAKE_COMMAND} -S ${SOURCE}/consumer -B ${WORK}/build -G Ninja
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK}/build)
run(${WORK}/build/consumer)
run(${WORK}/build/consumer_c)

# pkg-config, as a Makefile-based engine would use it.
file(GLOB_RECURSE pc ${prefix}/*/kvoffload.pc)
list(LENGTH pc n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "expected one kvoffload.pc under ${prefix}, found: ${pc}")
endif()
get_filename_component(pcdir ${pc} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pcdir})
execute_process(COMMAND pkg-config --cflags --libs kvoffload OUTPUT_VARIABLE flags
                RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config kvoffload failed")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${CC} -std=c99 ${SOURCE}/consumer/main.c ${flags} -o ${WORK}/consumer_pc)
get_filename_component(libdir ${pcdir} DIRECTORY)
set(ENV{LD_LIBRARY_PATH} ${libdir})
run(${WORK}/consumer_pc)
