// The kvoffload._kvoffload extension module and its exceptions: one Python exception class
// per C API status (error.hpp's table, mapped by kvoffload::classify), so Python callers catch
// the same categories C callers test for.

#include <Python.h>

#include <nanobind/stl/string.h>

#include <filesystem>
#include <ios>
#include <iterator>

#include "bindings.hpp"
#include "kvoffload/byte_size.hpp"
#include "kvoffload/device.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/version.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvoffload::python {
namespace {
PyObject* error_type = nullptr;
// Indexed by ErrorCode (1..6); [0] unused.
PyObject* types[7] = {};

PyObject* make_type(nb::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("kvoffload.") + name;
  PyObject* t = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (t == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(t);
  return t;
}
}  // namespace

void bind_errors(nb::module_& m) {
  error_type = make_type(m, "Error", PyExc_RuntimeError, "Base of every kvoffload error.");
  nb::object a = nb::make_tuple(nb::handle(error_type), nb::handle(PyExc_ValueError));
  types[1] = make_type(m, "InvalidArgument", a.ptr(),
                       "Bad input; the object that raised it is unchanged.");
  nb::object b = nb::make_tuple(nb::handle(error_type), nb::handle(PyExc_MemoryError));
  types[2] = make_type(m, "OutOfMemory", b.ptr(), "Host or device memory ran out.");
  types[3] = make_type(m, "CudaError", error_type, "A CUDA call failed.");
  types[4] = make_type(m, "Unsupported", error_type,
                       "Not available in this build or on this machine (e.g. the CUDA backend "
                       "without a CUDA build or device).");
  types[5] =
      make_type(m, "InternalError", error_type, "A bug in kvoffload: please report the message.");
  nb::object c = nb::make_tuple(nb::handle(error_type), nb::handle(PyExc_OSError));
  types[6] = make_type(m, "IoError", c.ptr(),
                       "The system refused a file or directory (a disk tier's directory that "
                       "cannot be created, say).");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    // kvoffload's exceptions and std::bad_alloc follow the table; anything else (nanobind's
    // own, Python errors passing through) goes on to nanobind's translators.
    try {
      std::rethrow_exception(p);
    } catch (const error&) {
    } catch (const std::bad_alloc&) {
    } catch (const std::filesystem::filesystem_error&) {
    } catch (const std::ios_base::failure&) {
    }
    const ClassifiedError e = classify(p);
    const int code = static_cast<int>(e.code);
    PyErr_SetString(
        code >= 1 && code < static_cast<int>(std::size(types)) ? types[code] : error_type,
        e.message.c_str());
  });
  m.def(
      "_raise_for_test",
      [](int code, const std::string& message) {
        throw_error_for_test(static_cast<ErrorCode>(code), message);
      },
      "Raises the C++ exception of an ErrorCode's row (tests of the error table only).");
}

}  // namespace kvoffload::python

NB_MODULE(_kvoffload, m) {
  m.doc() = "kvoffload: KV-cache offloading between GPU and host memory (native part)";
  kvoffload::python::bind_errors(m);
  kvoffload::python::bind_config(m);
  kvoffload::python::bind_scheduler(m);
  kvoffload::python::bind_worker(m);
  kvoffload::python::bind_vllm(m);
  m.attr("__version__") = KVOFFLOAD_VERSION_STRING;
  m.def(
      "_parse_bytes",
      [](const std::string& text, const std::string& field) {
        return kvoffload::parse_bytes(text, field);
      },
      "text"_a, "field"_a, "A byte size such as \"500GiB\" (the library's parser).");
  m.def("built_with_cuda", &kvoffload::built_with_cuda,
        "Whether this build of the library contains the CUDA backend.");
  m.def("cuda_device_count", &kvoffload::cuda_device_count,
        "CUDA devices visible to this process (0 without a CUDA build, driver or device).");
}
