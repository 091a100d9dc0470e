"""The accelerators a plan projects step time for: peak bf16 FLOP/s, memory, links.

One row per `--accelerator` name. Peak FLOP/s are dense bf16 matrix throughput
(not the 2x "with sparsity" figures); HBM is the capacity and bandwidth of one
chip; `link_bw` is what one chip can send per second to its neighbours inside a
node (NVLink) or a slice (ICI), `network_bw` what it can send to another node
(GPUs: one 400 Gb/s NIC per GPU, as in NVIDIA's DGX H100/H200 reference nodes;
TPUs: ICI spans the slice, so the same as `link_bw`).

Sources (vendor datasheets and documentation, read 2026):
  H100 SXM5  NVIDIA H100 Tensor Core GPU datasheet: bf16 1,979 TFLOPS with
             sparsity (989 dense), 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s
             (both directions together: 450 GB/s each way).
  H200 SXM   NVIDIA H200 datasheet: the H100's compute, 141 GB HBM3e at 4.8 TB/s,
             NVLink 900 GB/s.
  H800 SXM5  NVIDIA H800 product brief: the H100's compute and HBM, NVLink
             400 GB/s (200 GB/s each way).
  A100 SXM4  NVIDIA A100 datasheet: bf16 312 TFLOPS dense, 80 GB HBM2e at
             2,039 GB/s, NVLink 600 GB/s (300 GB/s each way); DGX A100 nodes have
             one 200 Gb/s NIC per GPU (25 GB/s).
  TPU v4     Google Cloud TPU v4 documentation: 275 TFLOP/s bf16, 32 GB HBM2 at
             1,200 GB/s, ICI 2,400 Gbps per chip (300 GB/s); two TensorCores a chip,
             which a TPU topology lists as two devices of 16 GB each.
  TPU v5e    Google Cloud TPU v5e documentation: 197 TFLOP/s bf16, 16 GB HBM2 at
             819 GB/s, ICI 1,600 Gbps per chip (200 GB/s).
  TPU v5p    Google Cloud TPU v5p documentation: 459 TFLOP/s bf16, 95 GB HBM2e at
             2,765 GB/s, ICI 4,800 Gbps per chip (600 GB/s).
  TPU v6e    Google Cloud TPU v6e (Trillium) documentation: 918 TFLOP/s bf16,
             32 GB HBM at 1,640 GB/s, ICI 3,584 Gbps per chip (448 GB/s).
"""

from __future__ import annotations

import dataclasses

GB = 1e9


@dataclasses.dataclass(frozen=True)
class Accelerator:
  name: str
  peak_flops: float    # dense bf16 FLOP/s
  hbm_bytes: float
  hbm_bw: float        # bytes/s
  link_bw: float       # bytes/s one way, inside a node (NVLink) or slice (ICI)
  network_bw: float    # bytes/s one way, to another node
  node_size: int       # chips that share `link_bw` (a GPU node; a TPU slice: no limit here)


ACCELERATORS = {
    "h100": Accelerator("H100 SXM", 989e12, 80 * GB, 3.35e12, 450 * GB, 50 * GB, 8),
    "h200": Accelerator("H200 SXM", 989e12, 141 * GB, 4.8e12, 450 * GB, 50 * GB, 8),
    "h800": Accelerator("H800 SXM", 989e12, 80 * GB, 3.35e12, 200 * GB, 50 * GB, 8),
    "a100": Accelerator("A100 SXM", 312e12, 80 * GB, 2.039e12, 300 * GB, 25 * GB, 8),
    "tpu_v4": Accelerator("TPU v4", 275e12, 32 * GB, 1.2e12, 300 * GB, 300 * GB, 1 << 30),
    "tpu_v5e": Accelerator("TPU v5e", 197e12, 16 * GB, 0.819e12, 200 * GB, 200 * GB, 1 << 30),
    "tpu_v5p": Accelerator("TPU v5p", 459e12, 95 * GB, 2.765e12, 600 * GB, 600 * GB, 1 << 30),
    "tpu_v6e": Accelerator("TPU v6e", 918e12, 32 * GB, 1.64e12, 448 * GB, 448 * GB, 1 << 30),
}


def accelerator(name: str) -> Accelerator:
  """The row of `name` (h100, h200, h800, a100, tpu_v4, tpu_v5e, tpu_v5p, tpu_v6e); a one-line
  error otherwise."""
  key = str(name).lower().replace("-", "_")
  if key not in ACCELERATORS:
    raise ValueError(f"--accelerator={name!r} is not one of {', '.join(ACCELERATORS)}.")
  return ACCELERATORS[key]


def collective_bw(chip: Accelerator, devices: int, hosts: int | None = None) -> float:
  """Bytes/s a device's collectives move at: the node's links while the mesh fits in
  one node, else the network (every collective assumed to cross it: an upper bound).
  `hosts`: the nodes the devices sit on when the target says (a GPU target `h800:2x4`
  crosses the network on 8 GPUs); else as few as hold them."""
  one_node = devices <= chip.node_size if hosts is None else hosts == 1
  return chip.link_bw if one_node else chip.network_bw


def projected_step_s(chip: Accelerator, *, flops: float, collective_bytes: float,
                     devices: int, mfu: float, hosts: int | None = None) -> dict[str, float]:
  """{"compute_s", "comm_s", "step_s"}: FLOPs per device at `mfu` of the peak, the
  collectives' bytes per device at `collective_bw`, and their sum (no overlap assumed:
  XLA overlaps some collectives with compute, so the sum is an upper bound)."""
  if not 0 < mfu <= 1:
    raise ValueError(f"--mfu={mfu!r} must be in (0, 1] (the share of peak FLOP/s reached).")
  compute = flops / (chip.peak_flops * mfu)
  comm = collective_bytes / collective_bw(chip, devices, hosts)
  return {"compute_s": compute, "comm_s": comm, "step_s": compute + comm}
