// ext/python/bindings.h: one bind_<concern> function per binding file.
#pragma once
#include <nanobind/nanobind.h>

namespace leapp::python {
void bind_driver(nanobind::module_& m);
}  // namespace leapp::python
