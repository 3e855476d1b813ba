// ext/python/bundle_bindings.cpp: leapp._native.Bundle, the validated bundle, and sha256.
//
// Bundle(bytes) runs the full C++ validation (the same code the ORT and torch
// op libraries use), so Python sees exactly what the runtimes accept;
// std::invalid_argument becomes ValueError with the field named.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "leapp/runtime.h"

namespace nb = nanobind;

namespace leapp::python {
namespace {

nb::tuple to_tuple(const std::vector<int64_t>& v) {
  nb::list l;
  for (int64_t x : v) l.append(x);
  return nb::tuple(l);
}

nb::list tensor_specs(const std::vector<TensorSpec>& specs) {
  nb::list out;
  for (const TensorSpec& t : specs) {
    nb::dict d;
    d["name"] = t.name;
    d["dtype"] = t.dtype;
    d["shape"] = to_tuple(t.shape);
    d["warp_dtype"] = t.warp_dtype;
    d["logical_shape"] = to_tuple(t.logical_shape);
    d["nbytes"] = t.bytes;
    d["buffer"] = t.buffer;
    out.append(d);
  }
  return out;
}

std::string_view bytes_view(const nb::bytes& data) { return {data.c_str(), data.size()}; }

nb::list option_list(const std::vector<BinaryOption>& list) {
  nb::list out;
  for (const BinaryOption& o : list) {
    nb::dict d;
    d["kind"] = o.binary.kind == BinaryKind::kPtx ? "ptx" : "cubin";
    d["arch"] = o.binary.arch;
    d["blob"] = o.binary.blob;
    d["ptx_isa"] = o.binary.ptx_isa;
    d["expected"] = o.expected;
    d["reason"] = o.reason;
    out.append(d);
  }
  return out;
}

nb::dict choice_dict(const BinaryChoice& c) {
  nb::dict d;
  d["candidates"] = option_list(c.candidates);
  d["excluded"] = option_list(c.excluded);
  d["chosen"] = c.chosen;
  d["holdings"] = c.holdings;
  d["summary"] = c.summary;
  return d;
}

}  // namespace

void bind_bundle(nb::module_& m) {
  nb::class_<PyBundle>(m, "Bundle",
                       "A validated leapp segment bundle (docs/bundle-format.md). Construction checks every offset, "
                       "length, hash and manifest field and raises ValueError naming the one that is wrong.")
      .def(
          "__init__",
          [](PyBundle* self, nb::bytes data) {
            std::string_view v = bytes_view(data);
            std::shared_ptr<const Bundle> b;
            {
              nb::gil_scoped_release release;
              b = intern_bundle(v.data(), v.size());
            }
            new (self) PyBundle{std::move(b)};
          },
          nb::arg("data"))
      .def_prop_ro("digest", [](const PyBundle& b) { return b.bundle->digest(); }, "hex sha256 of the file (cache key)")
      .def_prop_ro("segment", [](const PyBundle& b) { return b.bundle->segment(); })
      .def_prop_ro("source", [](const PyBundle& b) { return b.bundle->manifest().source; })
      .def_prop_ro("size", [](const PyBundle& b) { return b.bundle->size(); })
      .def_prop_ro("manifest_json", [](const PyBundle& b) { return std::string(b.bundle->manifest_json()); })
      .def_prop_ro("producer",
                   [](const PyBundle& b) {
                     nb::dict d;
                     for (const auto& kv : b.bundle->manifest().producer)  // keys may hold a NUL: pass the size
                       d[nb::str(kv.first.data(), kv.first.size())] = kv.second;
                     return d;
                   })
      .def_prop_ro("inputs", [](const PyBundle& b) { return tensor_specs(b.bundle->manifest().inputs); },
                   "[{name, dtype, shape, warp_dtype, logical_shape, nbytes, buffer}] in signature order")
      .def_prop_ro("outputs", [](const PyBundle& b) { return tensor_specs(b.bundle->manifest().outputs); })
      .def_prop_ro("blob_count", [](const PyBundle& b) { return b.bundle->blob_count(); })
      .def(
          "blob",
          [](const PyBundle& b, uint32_t index) {
            std::string_view v = b.bundle->blob(index);
            return nb::bytes(v.data(), v.size());
          },
          nb::arg("index"))
      .def(
          "binary_image",
          [](const PyBundle& b, uint32_t module, uint32_t index) {
            const Manifest& man = b.bundle->manifest();
            if (module >= man.modules.size() || index >= man.modules[module].binaries.size())
              throw std::invalid_argument("binary " + std::to_string(module) + "." + std::to_string(index) +
                                          " out of range");
            std::string image;
            {
              nb::gil_scoped_release release;
              image = b.bundle->binary_image(man.modules[module].binaries[index]);
            }
            return nb::bytes(image.data(), image.size());
          },
          nb::arg("module"), nb::arg("index"),
          "modules[module].binaries[index] as the loader hands it to the driver: its blob, LZ4-decoded when the "
          "manifest gives it an encoding.")
      .def(
          "binary_candidates",
          [](const PyBundle& b, uint32_t module, int major, int minor) {
            const Manifest& man = b.bundle->manifest();
            if (module >= man.modules.size())
              throw std::invalid_argument("module " + std::to_string(module) + " out of range (" +
                                          std::to_string(man.modules.size()) + " modules)");
            nb::list out;
            for (const BinarySpec& s : binary_candidates(man.modules[module], major, minor))
              out.append(nb::make_tuple(s.kind == BinaryKind::kPtx ? "ptx" : "cubin", s.arch));
            return out;
          },
          nb::arg("module"), nb::arg("major"), nb::arg("minor"),
          "The binaries a device of compute capability major.minor would try, best first: [(kind, arch)].")
      .def(
          "binary_choice",
          [](const PyBundle& b, uint32_t module, int major, int minor, int driver_version, const std::string& device) {
            return choice_dict(choose_binary(b.bundle->manifest(), module, major, minor, driver_version, device));
          },
          nb::arg("module"), nb::arg("major"), nb::arg("minor"), nb::arg("driver_version") = 0,
          nb::arg("device") = "",
          "The runtime's own binary choice for a device of compute capability major.minor under a CUDA driver of "
          "version driver_version (cuDriverGetVersion; 0 = unknown): {candidates (the load order: [{kind, arch, blob, "
          "ptx_isa, expected, reason}]), excluded, chosen (index into candidates, -1: none expected to load), "
          "holdings, summary}.")
      .def(
          "check_signature",
          [](const PyBundle& b, const std::string& signature) { check_signature(*b.bundle, parse_signature(signature)); },
          nb::arg("signature"), "Raises ValueError when an op's signature string does not describe this bundle.")
      .def("__repr__", [](const PyBundle& b) {
        return "<leapp._native.Bundle '" + b.bundle->segment() + "' " + b.bundle->digest().substr(0, 12) + ", " +
               std::to_string(b.bundle->size()) + " bytes>";
      });

  m.def(
      "driver_ptx_isa",
      [](int driver_version) {
        std::pair<int, int> isa = driver_ptx_isa(driver_version);
        return nb::make_tuple(isa.first, isa.second);
      },
      nb::arg("driver_version"),
      "(major, minor) of the newest PTX ISA a CUDA driver of this version JIT-compiles; (0, 0) for 0 (unknown), "
      "(99, 99) for a major version after 13.");
  m.def(
      "binary_choice_for",
      [](const std::vector<std::tuple<std::string, uint32_t, std::string>>& binaries, int major, int minor,
         int driver_version, const std::string& device, const std::string& cuda_toolkit) {
        Manifest m;  // one module holding these binaries: the choice for a bundle that is not at hand
        m.producer.emplace_back("cuda_toolkit", cuda_toolkit);
        ModuleSpec spec;
        for (const auto& [kind, arch, isa] : binaries) {
          if (kind != "ptx" && kind != "cubin") throw std::invalid_argument("kind must be 'ptx' or 'cubin', got '" + kind + "'");
          BinarySpec b;
          b.kind = kind == "ptx" ? BinaryKind::kPtx : BinaryKind::kCubin;
          b.arch = arch;
          b.blob = uint32_t(spec.binaries.size());
          b.ptx_isa = b.kind == BinaryKind::kPtx ? isa : "";
          spec.binaries.push_back(b);
        }
        m.modules.push_back(std::move(spec));
        return choice_dict(choose_binary(m, 0, major, minor, driver_version, device));
      },
      nb::arg("binaries"), nb::arg("major"), nb::arg("minor"), nb::arg("driver_version") = 0, nb::arg("device") = "",
      nb::arg("cuda_toolkit") = "",
      "Bundle.binary_choice for a module holding `binaries` [(kind, arch, ptx_isa)] built by CUDA `cuda_toolkit`: "
      "what a bundle of that coverage would load on a device (leapp doctor, the coverage matrix tests).");
  m.def("ptx_isa_min_driver", &ptx_isa_min_driver, nb::arg("isa_major"), nb::arg("isa_minor"),
        "The oldest CUDA driver version (e.g. 13040) that reads this PTX ISA; 0 when it is newer than all known.");

  m.def(
      "lz4_block_decode",
      [](nb::bytes block, uint64_t decoded_bytes) {
        std::string out;
        {
          nb::gil_scoped_release release;
          out = lz4_block_decode(bytes_view(block), decoded_bytes);
        }
        return nb::bytes(out.data(), out.size());
      },
      nb::arg("block"), nb::arg("decoded_bytes"),
      "The runtime's decoder of compressed binaries (docs/bundle-format.md 1.1): the decoded_bytes bytes of one "
      "LZ4 block; ValueError naming the broken rule and byte offset for any block that breaks a rule.");
  m.def(
      "sha256",
      [](nb::bytes data) {
        std::string_view v = bytes_view(data);
        return sha256_hex(v.data(), v.size());
      },
      nb::arg("data"), "Hex SHA-256 computed by leapp's own C++ implementation (tests compare it with hashlib).");
}

}  // namespace leapp::python
