"""Worker: a few optimizer steps of a tiny MLP under accelerate DDP, plus a one-process reference.

Each of the 2 ranks trains on its half of a fixed global batch of 2B rows. DDP averages gradients, so
with a per-row-mean loss the update equals one process training on all 2B rows.
"""

import torch
from accelerate import Accelerator
from launch import save_result

STEPS, B = 3, 4


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def batches():
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        yield torch.randn(2 * B, 5, generator=gen), torch.randn(2 * B, 1, generator=gen)


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


accelerator = Accelerator(cpu=True)
rank, world = accelerator.process_index, accelerator.num_processes
model = make_model()
opt = torch.optim.Adam(model.parameters(), lr=0.05)
model, opt = accelerator.prepare(model, opt)
gathered_losses = []
for x, y in batches():
    local_x, local_y = x[rank * B : (rank + 1) * B], y[rank * B : (rank + 1) * B]
    loss = torch.nn.functional.mse_loss(model(local_x), local_y)
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
    gathered_losses.append(accelerator.gather(loss.detach()[None]).mean().item())

params = accelerator.unwrap_model(model)
all_params = accelerator.gather(flat(params)[None])  # (world, P): every rank's copy
result = {
    "world": world,
    "backend": str(accelerator.state.backend),
    "params": flat(params).tolist(),
    "max_rank_diff": (all_params - all_params[0]).abs().max().item(),
    "gathered_losses": gathered_losses,
}
if rank == 0:  # the same run in one process on the full 2B batch
    ref = make_model()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.05)
    ref_losses = []
    for x, y in batches():
        loss = torch.nn.functional.mse_loss(ref(x), y)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(loss.item())
    result.update(reference_params=flat(ref).tolist(), reference_losses=ref_losses)
save_result(result)
