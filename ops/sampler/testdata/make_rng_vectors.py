#!/usr/bin/env python3
"""Reference outputs for ops/sampler/rng.h, from the `randomgen` package's xoshiro256**.

    pip install randomgen numpy
    python3 ops/sampler/testdata/make_rng_vectors.py > ops/sampler/testdata/rng_vectors.json

splitmix64 (used only to expand a seed into xoshiro's four state words) is the ten-line
reference algorithm of Vigna's splitmix64.c, checked below against its well-known first output
for seed 0 (0xe220a8397b1dcdaf). The xoshiro256** outputs come from randomgen.Xoshiro256, an
independent C implementation, started from that state. (Kept beside the test rather than under
tools/reference/ because this package's owner may only write here; move it there if preferred.)
"""

import json

import numpy as np
import randomgen

MASK = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


assert splitmix64(0)[1] == 0xE220A8397B1DCDAF

cases = []
for seed in [0, 1, 42, 0xDEADBEEFCAFEF00D, MASK]:
    sm, words = seed, []
    for _ in range(4):
        sm, out = splitmix64(sm)
        words.append(out)
    gen = randomgen.Xoshiro256(0)
    st = gen.state
    st["s"] = np.array(words, dtype=np.uint64)
    st["has_uint32"] = 0
    st["uinteger"] = 0
    gen.state = st
    outputs = [int(x) for x in gen.random_raw(16)]
    cases.append({
        "seed": str(seed),
        "state": [str(w) for w in words],
        # decimal strings: JSON readers differ on integers above 2^53
        "outputs": [str(x) for x in outputs],
        # Rng::NextDouble is (output >> 11) * 2^-53; exact in a double.
        "doubles": [float((x >> 11) * 2.0**-53) for x in outputs],
    })
print(json.dumps({"randomgen": randomgen.__version__, "cases": cases}, indent=1))
