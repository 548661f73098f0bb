"""pytorch/examples mnist/main.py (commit f15fac72e01158bcb704dded7c7e511f7a712a5f), in torch.

The original's network, loop and SGD with momentum at a small scale. Lines marked ``compare:``
are the same under both frameworks and let the porting table compare them step by step:
synthetic images from NumPy instead of torchvision's MNIST, no shuffling and no dropout (the
frameworks draw different random numbers), the first weights read from a file, the losses
written to one.
"""
from __future__ import print_function
import argparse
import json
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))  # compare: no Dropout2d
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))  # compare: no F.dropout after it
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def train(args, model, device, train_loader, optimizer, epoch, losses):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # compare
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader), loss.item()))


def synthetic_mnist(n, seed):
    """compare: 28x28 images whose label is a fixed random linear function of the pixels."""
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((n, 1, 28, 28)).astype(np.float32)
    labels = np.argmax(images.reshape(n, -1) @ rng.standard_normal((784, 10)), axis=1)
    return torch.utils.data.TensorDataset(torch.from_numpy(images), torch.from_numpy(labels))


def main():
    parser = argparse.ArgumentParser(description='PyTorch MNIST Example')
    parser.add_argument('--batch-size', type=int, default=64, metavar='N')
    parser.add_argument('--steps', type=int, default=20, help='compare: batches in all')
    parser.add_argument('--epochs', type=int, default=1, metavar='N')
    parser.add_argument('--lr', type=float, default=0.01, metavar='LR')
    parser.add_argument('--momentum', type=float, default=0.5, metavar='M')
    parser.add_argument('--no-cuda', action='store_true', default=False)
    parser.add_argument('--seed', type=int, default=1, metavar='S')
    parser.add_argument('--log-interval', type=int, default=10, metavar='N')
    parser.add_argument('--init-weights', help='compare: start from these weights (.npz)')
    parser.add_argument('--save-init', help='compare: write the first weights here (.npz)')
    parser.add_argument('--losses-out', help='compare: write the losses here (JSON)')
    args = parser.parse_args()
    use_cuda = not args.no_cuda and torch.cuda.is_available()

    torch.manual_seed(args.seed)

    device = torch.device("cuda" if use_cuda else "cpu")

    kwargs = {'num_workers': 1, 'pin_memory': True} if use_cuda else {}
    train_loader = torch.utils.data.DataLoader(
        synthetic_mnist(args.batch_size * args.steps // args.epochs, args.seed),
        batch_size=args.batch_size, shuffle=False, **kwargs)  # compare: not shuffled

    model = Net().to(device)
    if args.init_weights:  # compare
        model.load_state_dict({k: torch.from_numpy(v) for k, v in np.load(args.init_weights).items()})
    if args.save_init:  # compare
        np.savez(args.save_init, **{k: np.asarray(v) for k, v in model.state_dict().items()})
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    losses = []
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch, losses)
    if args.losses_out:  # compare
        with open(args.losses_out, 'w') as f:
            json.dump(losses, f)


if __name__ == '__main__':
    main()
