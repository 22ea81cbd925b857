// The kvoffload._kvoffload extension module and its exceptions: one Python exception class
// per C API status, so Python callers catch the same categories C callers test for.

#include <Python.h>

#include "bindings.hpp"
#include "kvoffload/device.hpp"
#include "kvoffload/error.hpp"

namespace nb = nanobind;

namespace kvoffload::python {
namespace {
PyObject* error_type = nullptr;
PyObject* invalid_argument_type = nullptr;
PyObject* out_of_memory_type = nullptr;
PyObject* cuda_error_type = nullptr;

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
  invalid_argument_type = make_type(m, "InvalidArgument", a.ptr(),
                                    "Bad input; the object that raised it is unchanged.");
  nb::object b = nb::make_tuple(nb::handle(error_type), nb::handle(PyExc_MemoryError));
  out_of_memory_type = make_type(m, "OutOfMemory", b.ptr(), "Host or device memory ran out.");
  cuda_error_type = make_type(m, "CudaError", error_type,
                              "A CUDA call failed, or CUDA is not available to this build.");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const invalid_argument& e) {
      PyErr_SetString(invalid_argument_type, e.what());
    } catch (const out_of_memory& e) {
      PyErr_SetString(out_of_memory_type, e.what());
    } catch (const cuda_error& e) {
      PyErr_SetString(cuda_error_type, e.what());
    } catch (const error& e) {
      PyErr_SetString(error_type, e.what());
    }
  });
}

}  // namespace kvoffload::python

NB_MODULE(_kvoffload, m) {
  m.doc() = "kvoffload: KV-cache offloading between GPU and host memory (native part)";
  kvoffload::python::bind_errors(m);
  kvoffload::python::bind_scheduler(m);
  kvoffload::python::bind_worker(m);
  m.def("built_with_cuda", &kvoffload::built_with_cuda,
        "Whether this build of the library contains the CUDA backend.");
  m.def("cuda_device_count", &kvoffload::cuda_device_count,
        "CUDA devices visible to this process (0 without a CUDA build, driver or device).");
}
