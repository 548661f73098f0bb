"""pytorch/tutorials recipes_source/recipes/amp_recipe.py (commit
db77dcf6e3637924f43852c014f2af9978b0f891), in torch: its "All together" loop, a stack of
Linear + ReLU under ``torch.autocast(dtype=torch.float16)`` with a GradScaler, and its
checkpoint of model, optimizer and scaler state.

Lines marked ``CPU:`` are the edits any CPU run of the recipe needs, under torch too: no
``.cuda()``, no CUDA timers and memory counters, a GradScaler for ``"cpu"``. Lines marked
``compare:`` are the same under both frameworks and let the porting table compare them step by
step: smaller sizes, data drawn with NumPy (the frameworks' ``torch.randn`` differ), the first
weights read from a file, the losses written to one.
"""
import argparse
import json
import numpy as np
import torch, time, gc

parser = argparse.ArgumentParser()
parser.add_argument('--init-weights', help='compare: start from these weights (.npz)')
parser.add_argument('--save-init', help='compare: write the first weights here (.npz)')
parser.add_argument('--losses-out', help='compare: write the losses here (JSON)')
args = parser.parse_args()

start_time = None


def start_timer():
    global start_time
    gc.collect()  # CPU: no torch.cuda.empty_cache / reset_max_memory_allocated / synchronize
    start_time = time.time()


def end_timer_and_print(local_msg):
    end_time = time.time()  # CPU: no torch.cuda.synchronize
    print("\n" + local_msg)
    print("Total execution time = {:.3f} sec".format(end_time - start_time))


def make_model(in_size, out_size, num_layers):
    layers = []
    for _ in range(num_layers - 1):
        layers.append(torch.nn.Linear(in_size, in_size))
        layers.append(torch.nn.ReLU())
    layers.append(torch.nn.Linear(in_size, out_size))
    return torch.nn.Sequential(*tuple(layers))  # CPU: no .cuda()


batch_size = 64  # compare: not 512
in_size = 64  # compare: not 4096
out_size = 64  # compare: not 4096
num_layers = 3
num_batches = 10  # compare: not 50
epochs = 2  # compare: not 3

device = 'cuda' if torch.cuda.is_available() else 'cpu'
torch.set_default_device(device)

rng = np.random.default_rng(0)  # compare: NumPy's numbers, the same in both
data = [torch.from_numpy(rng.standard_normal((batch_size, in_size), dtype=np.float32)) for _ in range(num_batches)]
targets = [torch.from_numpy(rng.standard_normal((batch_size, out_size), dtype=np.float32)) for _ in range(num_batches)]

loss_fn = torch.nn.MSELoss()  # CPU: no .cuda()

use_amp = True

net = make_model(in_size, out_size, num_layers)
if args.init_weights:  # compare
    net.load_state_dict({k: torch.from_numpy(v) for k, v in np.load(args.init_weights).items()})
if args.save_init:  # compare
    np.savez(args.save_init, **{k: np.asarray(v) for k, v in net.state_dict().items()})
opt = torch.optim.SGD(net.parameters(), lr=0.001)
scaler = torch.amp.GradScaler("cpu", enabled=use_amp)  # CPU: not torch.cuda.amp.GradScaler

losses = []
start_timer()
for epoch in range(epochs):
    for input, target in zip(data, targets):
        with torch.autocast(device_type=device, dtype=torch.float16, enabled=use_amp):
            output = net(input)
            loss = loss_fn(output, target)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad() # set_to_none=True here can modestly improve performance
        losses.append(loss.item())  # compare
end_timer_and_print("Mixed precision:")

checkpoint = {"model": net.state_dict(),
              "optimizer": opt.state_dict(),
              "scaler": scaler.state_dict()}
net.load_state_dict(checkpoint["model"])
opt.load_state_dict(checkpoint["optimizer"])
scaler.load_state_dict(checkpoint["scaler"])

if args.losses_out:  # compare
    with open(args.losses_out, 'w') as f:
        json.dump(losses, f)
