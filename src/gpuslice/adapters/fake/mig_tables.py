"""The GPU-instance profiles of the simulated MIG-capable GPUs, as `nvidia-smi mig -lgip`
and `-lgipp` report them (NVIDIA's MIG user guide, "Supported MIG Profiles").

Placements are in memory slices (8 per GPU) and the same on every model: a 1g at any of
0..6, a 1g with twice the memory at 0, 2, 4 or 6, a 2g at 0, 2 or 4, a 3g at 0 or 4
(4 memory slices for 3 compute slices), a 4g at 0, a 7g over all 8.
"""

from __future__ import annotations

from gpuslice.core.devices import MigEngines
from gpuslice.core.mig import MigProfileSpec, Placement

# GPU-instance profile id -> (GPU slices, memory slices per placement, starts, instances).
_SHAPES = {
    19: (1, 1, range(7), 7),  # 1g
    20: (1, 1, range(7), 1),  # 1g+me: all media engines, one at a time
    15: (1, 2, (0, 2, 4, 6), 4),  # 1g with twice the memory
    14: (2, 2, (0, 2, 4), 3),  # 2g
    9: (3, 4, (0, 4), 2),  # 3g
    5: (4, 4, (0,), 1),  # 4g
    0: (7, 8, (0,), 1),  # 7g
}

# Engines per GPU slice count, from the guide's tables (A100 and H100 alike; no NVENC).
_ENGINES = {
    19: MigEngines(copy=1),
    20: MigEngines(copy=1, decoder=1, jpeg=1, ofa=1),
    15: MigEngines(copy=1, decoder=1),
    14: MigEngines(copy=2, decoder=1),
    9: MigEngines(copy=3, decoder=2),
    5: MigEngines(copy=4, decoder=2),
    0: MigEngines(copy=7, decoder=5, jpeg=1, ofa=1),
}


def _table(rows: dict[int, tuple[str, int, int]]) -> tuple[MigProfileSpec, ...]:
    """Profiles from {profile id: (name, memory MiB, multiprocessors)}."""
    specs = []
    for profile_id, (name, memory_mib, sms) in rows.items():
        slices, size, starts, count = _SHAPES[profile_id]
        specs.append(
            MigProfileSpec(
                name=name,
                gi_profile_id=profile_id,
                memory_mib=memory_mib,
                multiprocessors=sms,
                slices=slices,
                instance_count=count,
                placements=tuple(Placement(s, size) for s in starts),
                engines=_ENGINES[profile_id],
            )
        )
    return tuple(specs)


A100_40GB = _table(
    {
        19: ("1g.5gb", 4864, 14),
        20: ("1g.5gb+me", 4864, 14),
        15: ("1g.10gb", 9856, 14),
        14: ("2g.10gb", 9856, 28),
        9: ("3g.20gb", 19968, 42),
        5: ("4g.20gb", 19968, 56),
        0: ("7g.40gb", 40192, 98),
    }
)

# The guide gives the A100-80GB's sizes as 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb and
# 7g.80gb; memory as `nvidia-smi mig -lgip` shows it there (9.5, 19.5, 39.25, 79.25 GiB).
A100_80GB = _table(
    {
        19: ("1g.10gb", 9728, 14),
        20: ("1g.10gb+me", 9728, 14),
        15: ("1g.20gb", 19968, 14),
        14: ("2g.20gb", 19968, 28),
        9: ("3g.40gb", 40192, 42),
        5: ("4g.40gb", 40192, 56),
        0: ("7g.80gb", 81152, 98),
    }
)

# 9.75 / 19.62 / 19.62 / 39.5 / 39.5 / 79.25 GiB; the 1g with twice the memory has 26 SMs.
H100_80GB = _table(
    {
        19: ("1g.10gb", 9984, 16),
        20: ("1g.10gb+me", 9984, 16),
        15: ("1g.20gb", 20096, 26),
        14: ("2g.20gb", 20096, 32),
        9: ("3g.40gb", 40448, 60),
        5: ("4g.40gb", 40448, 64),
        0: ("7g.80gb", 81152, 132),
    }
)

# 16.0 / 32.25 / 32.25 / 69.5 / 69.5 GiB; the 7g is taken as twice the 4g (139 GiB).
H200 = _table(
    {
        19: ("1g.18gb", 16384, 16),
        20: ("1g.18gb+me", 16384, 16),
        15: ("1g.35gb", 33024, 26),
        14: ("2g.35gb", 33024, 32),
        9: ("3g.71gb", 71168, 60),
        5: ("4g.71gb", 71168, 64),
        0: ("7g.141gb", 142336, 132),
    }
)
