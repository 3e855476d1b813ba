// ext/python/signing_bindings.cpp: leapp._native.verify_folder, the verifier both readers share (docs/signing.md).
//
// Raises leapp._native.SignatureError (a RuntimeError subclass) with the verifier's text; leapp.errors wraps it
// in leapp.errors.SignatureError. The GIL is released while files are hashed.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "leapp/signing.h"

namespace nb = nanobind;

namespace leapp::python {

void bind_signing(nb::module_& m) {
  static nb::exception<signing::SignatureProblem> signature_error(m, "SignatureError", PyExc_RuntimeError);
  (void)signature_error;

  m.def(
      "verify_folder",
      [](const std::string& folder, nb::list keys, const std::string& signature) {
        std::vector<std::string> pems;
        for (nb::handle key : keys) {
          if (nb::isinstance<nb::bytes>(key)) {
            nb::bytes b = nb::borrow<nb::bytes>(key);
            pems.emplace_back(b.c_str(), b.size());
          } else if (nb::isinstance<nb::str>(key)) {
            pems.push_back(nb::cast<std::string>(key));
          } else {
            throw nb::type_error("verify_folder: each trusted key is PEM text (bytes or str)");
          }
        }
        nb::gil_scoped_release release;
        return signing::verify_folder(folder, pems, signature);
      },
      nb::arg("folder"), nb::arg("keys"), nb::arg("signature") = signing::kDefaultSignature,
      "Verifies an export folder against its signature (relative: inside the folder) with PEM public keys (EC "
      "P-256/384/521, bytes or str); returns {relative path: sha256 hex} of every signed file. Raises "
      "SignatureError (RuntimeError) naming the file, field or key.");
}

}  // namespace leapp::python
