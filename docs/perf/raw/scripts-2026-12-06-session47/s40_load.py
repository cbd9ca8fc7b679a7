"""Background GPU load for the race experiment: matmuls of varying size with short random pauses."""
import random, sys, time
import torch
rng = random.Random(int(sys.argv[1]))
xs = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for n in (512, 2048, 6144)]
end = time.time() + float(sys.argv[2])
while time.time() < end:
    a = rng.choice(xs)
    for _ in range(rng.randint(1, 20)):
        a @ a
    torch.cuda.synchronize()
    time.sleep(rng.random() * 0.002)
