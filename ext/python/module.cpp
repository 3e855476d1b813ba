// ext/python/module.cpp: the nanobind module leapp._native.
//
// Each concern binds itself in its own file (bind_<concern>); core throws
// standard exceptions and nanobind maps them (runtime_error -> RuntimeError,
// invalid_argument -> ValueError). DriverUnavailable maps to leapp's own
// exception so Python can tell "no GPU here" from a real failure.
#include <nanobind/nanobind.h>

#include "bindings.h"

NB_MODULE(_native, m) {
  m.doc() = "leapp native runtime: bundle reader and CUDA-driver replay (no Warp, no cudart)";
  leapp::python::bind_driver(m);
  leapp::python::bind_bundle(m);
  leapp::python::bind_replay(m);
  leapp::python::bind_signing(m);
}
