"""Measures the two ceilings the CUDA kernels are judged against, on the GPU
machine, with PyTorch (present in the device image): the bf16 matrix rate
(an 8192^3 product through cuBLAS, random data, never zeros) and the
device-to-device copy bandwidth (bytes read + written). CUDA-event medians
after warm-up. Prints "RESULT<TAB>name<TAB>value<TAB>unit<TAB>note" lines.

  python3 tools/gpu/ceilings.py
"""
import statistics

import torch


def median_seconds(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(times)


def main():
    dev = torch.device("cuda")
    print("torch", torch.__version__, torch.cuda.get_device_name(0), flush=True)
    n = 8192
    xs = [torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(3)]
    ys = [torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(3)]
    out = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    i = [0]

    def mm():
        j = i[0] % 3
        i[0] += 1
        torch.matmul(xs[j], ys[j], out=out)

    t = median_seconds(mm)
    print(f"RESULT\tbf16_matmul_ceiling\t{2 * n**3 / t / 1e12:.4g}\tTFLOP/s\t"
          f"torch.matmul {n}^3 random bf16", flush=True)
    src = torch.randint(1, 2**31 - 1, (512 * 2**20,), device=dev, dtype=torch.int32)
    dst = torch.empty_like(src)
    t = median_seconds(lambda: dst.copy_(src))
    print(f"RESULT\thbm_copy_torch\t{2 * src.numel() * 4 / t / 1e9:.4g}\tGB/s\t"
          "torch copy_ 2 GiB, read+write", flush=True)


if __name__ == "__main__":
    main()
