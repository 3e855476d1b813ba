"""Runs a LEAPP bundle in the existing LEAPP tool (0.7.2), the way its users run one; a child process of the tests.

Started as ``python -S leapp_client_run.py CLIENT_DIR SITE_DIR BUNDLE_YAML STEPS_PT OUT_PT``: with -S no .pth file
runs, so this project's editable install (a meta-path finder) stays out and ``import leapp`` is the client's.
STEPS_PT holds a list of steps, each a dict ``"node/input" -> tensor``; OUT_PT gets a list of the
``run_policy`` results. Exit status 3 when the import found another leapp.
"""

import sys

client, site, bundle, steps_file, out_file = sys.argv[1:6]
sys.path[:0] = [client, site]

import leapp  # noqa: E402
import torch  # noqa: E402

if not leapp.__file__.startswith(client) or leapp.__version__ != "0.7.2":
    print(f"leapp_client_run: imported {leapp.__file__} ({getattr(leapp, '__version__', '?')}), not the client",
          file=sys.stderr)
    sys.exit(3)

manager = leapp.InferenceManager(bundle)
steps = torch.load(steps_file, weights_only=True)
results = []
with torch.no_grad():
    for step in steps:
        results.append({k: v.detach().clone() for k, v in manager.run_policy(step).items()})
torch.save({"results": results, "inputs": manager.inputs, "outputs": manager.outputs,
            "leapp_file": leapp.__file__}, out_file)
