"""horovod/horovod examples/pytorch/pytorch_mnist.py (commit
034964ac5456b5484f156cc1a37655f349c13a37), in torch with Horovod, started by horovodrun at two
processes: DistributedSampler shards, learning rate scaled by the world size, parameters and
optimizer state broadcast from rank 0, DistributedOptimizer, the test metrics averaged with
``hvd.allreduce``.

Lines marked ``compare:`` are the same under both frameworks and let the porting table compare
them step by step: synthetic images from NumPy instead of torchvision's MNIST, no dropout (the
frameworks draw different random numbers), rank 0 alone reading the first weights from a file
(the broadcast brings them to the others), each rank's losses written to one. The mixed
precision path, Adasum and ``horovod.run`` are left out.
"""
import argparse
import json
import numpy as np
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import horovod.torch as hvd

parser = argparse.ArgumentParser(description='PyTorch MNIST Example')
parser.add_argument('--batch-size', type=int, default=32, metavar='N')
parser.add_argument('--test-batch-size', type=int, default=64, metavar='N')
parser.add_argument('--steps', type=int, default=20, help='compare: batches per rank')
parser.add_argument('--epochs', type=int, default=1, metavar='N')
parser.add_argument('--lr', type=float, default=0.01, metavar='LR')
parser.add_argument('--momentum', type=float, default=0.5, metavar='M')
parser.add_argument('--no-cuda', action='store_true', default=False)
parser.add_argument('--seed', type=int, default=42, metavar='S')
parser.add_argument('--log-interval', type=int, default=10, metavar='N')
parser.add_argument('--fp16-allreduce', action='store_true', default=False)
parser.add_argument('--gradient-predivide-factor', type=float, default=1.0)
parser.add_argument('--init-weights', help='compare: rank 0 starts from these weights (.npz)')
parser.add_argument('--save-init', help='compare: write the first weights here (.npz)')
parser.add_argument('--losses-out', help='compare: write the losses here (JSON, one per rank)')


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


def synthetic_mnist(n, seed):
    """compare: 28x28 images whose label is a fixed random linear function of the pixels."""
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((n, 1, 28, 28)).astype(np.float32)
    labels = np.argmax(images.reshape(n, -1) @ rng.standard_normal((784, 10)), axis=1)
    return torch.utils.data.TensorDataset(torch.from_numpy(images), torch.from_numpy(labels))


def train(args):
    def train_epoch(epoch):
        model.train()
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())  # compare
            if batch_idx % args.log_interval == 0:
                print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                    epoch, batch_idx * len(data), len(train_sampler),
                    100. * batch_idx / len(train_loader), loss.item()))

    def metric_average(val, name):
        tensor = torch.tensor(val)
        avg_tensor = hvd.allreduce(tensor, name=name)
        return avg_tensor.item()

    def test():
        model.eval()
        test_loss = 0.
        test_accuracy = 0.
        for data, target in test_loader:
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()
            pred = output.data.max(1, keepdim=True)[1]
            test_accuracy += pred.eq(target.data.view_as(pred)).cpu().float().sum()
        test_loss /= len(test_sampler)
        test_accuracy /= len(test_sampler)
        test_loss = metric_average(test_loss, 'avg_loss')
        test_accuracy = metric_average(test_accuracy, 'avg_accuracy')
        if hvd.rank() == 0:
            print('\nTest set: Average loss: {:.4f}, Accuracy: {:.2f}%\n'.format(
                test_loss, 100. * test_accuracy))

    hvd.init()
    torch.manual_seed(args.seed)
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())
        torch.cuda.manual_seed(args.seed)
    torch.set_num_threads(1)

    kwargs = {'num_workers': 1, 'pin_memory': True} if args.cuda else {}
    train_dataset = synthetic_mnist(args.batch_size * args.steps * hvd.size(), args.seed)
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, sampler=train_sampler, **kwargs)
    test_dataset = synthetic_mnist(args.test_batch_size * 2, args.seed + 1)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size,
                                              sampler=test_sampler, **kwargs)

    model = Net()
    if args.init_weights and hvd.rank() == 0:  # compare
        model.load_state_dict({k: torch.from_numpy(v) for k, v in np.load(args.init_weights).items()})
    if args.save_init and hvd.rank() == 0:  # compare
        np.savez(args.save_init, **{k: np.asarray(v) for k, v in model.state_dict().items()})
    lr_scaler = hvd.size()
    if args.cuda:
        model.cuda()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler,
                          momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)
    losses = []
    for epoch in range(1, args.epochs + 1):
        train_epoch(epoch)
        test()
    if args.losses_out:  # compare
        with open(f"{args.losses_out}.rank{hvd.rank()}", 'w') as f:
            json.dump(losses, f)


if __name__ == '__main__':
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    train(args)
