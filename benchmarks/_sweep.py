import numpy as np
from posttrainllm import webgpu as W
g = W.GPU()
for n in (2048, 4096):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    for p in [{}, {"BK": 8}, {"BK": 32}]:
        c, t = g.matmul(a, b, "matmul_vec4_8x8.wgsl", p, repeat=10)
        print(n, p, f"{2*n**3/t.median_ms/1e6:,.0f}", flush=True)
