// ext/python/bindings.h: one bind_<concern> function per binding file.
#pragma once
#include <nanobind/nanobind.h>

#include <memory>

#include "leapp/runtime.h"

namespace leapp::python {

/// The Python-side handle of a validated bundle (shared with the bundle table).
struct PyBundle {
  std::shared_ptr<const Bundle> bundle;
};

void bind_driver(nanobind::module_& m);
void bind_bundle(nanobind::module_& m);
void bind_replay(nanobind::module_& m);
void bind_signing(nanobind::module_& m);
}  // namespace leapp::python
