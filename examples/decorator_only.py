"""leapp with decorators only: each node is a function, args in and return value out.

`contacts` turns per-foot contact forces into a contact mask and force norms with a
Warp kernel (exported as PT2); `gait` is plain torch (exported as ONNX).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import warp as wp

import leapp
from leapp import annotate
from leapp.errors import ValidationError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # quiet_output.py, also when loaded by path
from quiet_output import quiet_output


@wp.kernel
def contact_state(forces: wp.array(dtype=wp.vec3), threshold: float,
                  norms: wp.array(dtype=float), mask: wp.array(dtype=float)):
    i = wp.tid()
    n = wp.length(forces[i])
    norms[i] = n
    mask[i] = wp.where(n > threshold, 1.0, 0.0)


@leapp.node("contacts", export_with="pt2")
def contacts(forces: torch.Tensor):
    flat = forces.reshape(-1, 3)
    norms = torch.empty(flat.shape[0], device=forces.device)
    mask = torch.empty(flat.shape[0], device=forces.device)
    with annotate.warp_op():
        wp.launch(contact_state, dim=flat.shape[0],
                  inputs=[wp.from_torch(flat, dtype=wp.vec3), 5.0],
                  outputs=[wp.from_torch(norms), wp.from_torch(mask)], device=str(forces.device))
    return {"norms": norms.reshape(forces.shape[:-1]), "mask": mask.reshape(forces.shape[:-1])}


@leapp.node("gait", export_with="onnx")
def gait(mask: torch.Tensor):
    return mask.mean(dim=-1, keepdim=True) * 2.0 - 1.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="exports")
    parser.add_argument("--verbose", action="store_true", help="also Warp's banner and torch's exporter notes")
    args = parser.parse_args(argv)
    quiet_output(args.verbose)
    wp.init()
    gpu = torch.cuda.is_available() and wp.is_cuda_available()
    device = "cuda:0" if gpu else "cpu"
    samples = [torch.randn(32, 4, 3, generator=torch.Generator().manual_seed(s)).mul(8).to(device) for s in range(3)]
    with leapp.trace("quadruped_contacts", save_path=args.out) as session:
        for forces in samples:
            gait(contacts(forces)["mask"])
    try:
        print(session.compile(validate=True))
    except ValidationError as e:
        # Without a GPU and without the segment's CPU code (no C++ compiler at export: docs/export-cpu.md),
        # contacts' Warp segment cannot be replayed ("needs-cuda"); gait, plain torch, was validated on the
        # CPU. Anything else is a real failure.
        if any(r.status != "needs-cuda" for r in e.results):
            raise
        print(e.report)
        print("'gait' was validated on the CPU; 'contacts' has no CPU code here and replays its Warp segment on "
              "CUDA only.")
        return 0
    pipeline = leapp.load(f"{args.out}/quadruped_contacts")  # on the CPU: the segment from its CPU code
    forces = samples[0]
    eager = gait(contacts(forces)["mask"])
    got = pipeline(forces=forces)["output"].to(eager.device)  # gait's return value; ORT's CPU EP returns host tensors
    err = (got - eager).abs().max().item()
    print(f"max |exported - eager|: {err:.3e}")
    return 0 if err <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
