// ext/python/driver_bindings.cpp: CUDA driver state for Python (leapp.doctor, tests).
#include <nanobind/nanobind.h>
#include <cstdint>
#include <stdexcept>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "leapp/cuda_driver.h"

namespace nb = nanobind;

namespace leapp::python {

void bind_driver(nb::module_& m) {
  static nb::exception<DriverUnavailable> driver_unavailable(m, "DriverUnavailable", PyExc_RuntimeError);
  (void)driver_unavailable;

  m.def(
      "driver_status",
      [] {
        DriverStatus s = driver_status();
        nb::dict d;
        d["available"] = s.available;
        d["error"] = s.error;
        d["version"] = s.version;
        d["assumed_version"] = s.assumed_version;
        d["assumed_error"] = s.assumed_error;
        nb::list devices;
        for (const DeviceInfo& info : s.devices) {
          nb::dict dev;
          dev["ordinal"] = info.ordinal;
          dev["name"] = info.name;
          dev["compute_capability"] = nb::make_tuple(info.cc_major, info.cc_minor);
          devices.append(dev);
        }
        d["devices"] = devices;
        return d;
      },
      "Loads libcuda.so.1 (once) and reports {available, error, version, assumed_version, assumed_error, devices} "
      "(assumed_version: $LEAPP_ASSUME_DRIVER, 0 when unset). Never raises.");

  m.def(
      "graph_host_nodes",
      [](uintptr_t graph) -> nb::object {
        if (graph == 0) throw std::invalid_argument("graph_host_nodes: a null graph handle");
        size_t hosts = 0;
        if (!count_graph_host_nodes(reinterpret_cast<CUgraph>(graph), hosts)) return nb::none();
        return nb::int_(hosts);
      },
      nb::arg("graph"),
      "The host-function nodes of a captured, not yet destroyed CUDA graph (a cudaGraph_t as an int, e.g. "
      "torch.cuda.CUDAGraph(keep_graph=True).raw_cuda_graph()), child graphs included; None when the driver "
      "cannot list them. Raises DriverUnavailable without a driver.");
}

}  // namespace leapp::python
