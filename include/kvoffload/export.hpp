#pragma once

// The shared library is built with hidden visibility; only what carries KVOFFLOAD_EXPORT (the
// kvoffload:: API) is exported.
#if defined(_WIN32)
#define KVOFFLOAD_EXPORT
#else
#define KVOFFLOAD_EXPORT __attribute__((visibility("default")))
#endif
