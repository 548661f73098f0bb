"""pytorch/examples word_language_model/main.py and model.py (commit
cd01f93000a6679e768700dd29e417a1e5fd10e5), in torch: a two-layer LSTM language model trained
with truncated backpropagation through time, gradient clipping and a hand-written SGD update.

Lines marked ``compare:`` are the same under both frameworks and let the porting table compare
them step by step: a synthetic corpus instead of Wikitext-2, no validation pass, dropout 0 (the
frameworks draw different random numbers), the first weights read from a file, the losses
written to one. The update is written ``add_(p.grad, alpha=-lr)``, the form upstream moved to
(torch 2 deprecates ``add_(-lr, p.grad.data)``).
"""
import argparse
import json
import numpy as np
import torch
import torch.nn as nn

parser = argparse.ArgumentParser(description='PyTorch Wikitext-2 RNN/LSTM Language Model')
parser.add_argument('--emsize', type=int, default=16, help='size of word embeddings')
parser.add_argument('--nhid', type=int, default=16, help='number of hidden units per layer')
parser.add_argument('--nlayers', type=int, default=2, help='number of layers')
parser.add_argument('--lr', type=float, default=20, help='initial learning rate')
parser.add_argument('--clip', type=float, default=0.25, help='gradient clipping')
parser.add_argument('--batch_size', type=int, default=4, metavar='N', help='batch size')
parser.add_argument('--bptt', type=int, default=8, help='sequence length')
parser.add_argument('--steps', type=int, default=20, help='compare: batches in all')
parser.add_argument('--dropout', type=float, default=0.0, help='compare: 0, not 0.2')
parser.add_argument('--tied', action='store_true', help='tie the word embedding and softmax weights')
parser.add_argument('--seed', type=int, default=1111, help='random seed')
parser.add_argument('--cuda', action='store_true', help='use CUDA')
parser.add_argument('--log-interval', type=int, default=10, metavar='N', help='report interval')
parser.add_argument('--init-weights', help='compare: start from these weights (.npz)')
parser.add_argument('--save-init', help='compare: write the first weights here (.npz)')
parser.add_argument('--losses-out', help='compare: write the losses here (JSON)')
args = parser.parse_args()

torch.manual_seed(args.seed)
device = torch.device("cuda" if args.cuda else "cpu")


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super(RNNModel, self).__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            if nhid != ninp:
                raise ValueError('When using the tied flag, nhid must be equal to emsize')
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        self.encoder.weight.data.uniform_(-initrange, initrange)
        self.decoder.bias.data.zero_()
        self.decoder.weight.data.uniform_(-initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        return decoded, hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


class Corpus(object):
    """compare: words drawn from a small vocabulary with a fixed Markov chain, numbered in the
    order they first appear, as data.Corpus numbers Wikitext-2's words."""

    def __init__(self, n_words, seed):
        rng = np.random.default_rng(seed)
        vocabulary = ['w%d' % i for i in range(24)]
        successors = rng.integers(0, len(vocabulary), size=(len(vocabulary), 3))
        word, self.idx2word, self.word2idx, ids = 0, [], {}, []
        for _ in range(n_words):
            word = successors[word, rng.integers(0, 3)]
            if vocabulary[word] not in self.word2idx:
                self.word2idx[vocabulary[word]] = len(self.idx2word)
                self.idx2word.append(vocabulary[word])
            ids.append(self.word2idx[vocabulary[word]])
        self.train = torch.tensor(ids, dtype=torch.long)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    data = data.view(bsz, -1).t().contiguous()
    return data.to(device)


corpus = Corpus(args.batch_size * (args.bptt * args.steps + 1), args.seed)
train_data = batchify(corpus.train, args.batch_size)
ntokens = len(corpus.idx2word)
model = RNNModel('LSTM', ntokens, args.emsize, args.nhid, args.nlayers, args.dropout, args.tied).to(device)
if args.init_weights:  # compare
    model.load_state_dict({k: torch.from_numpy(v) for k, v in np.load(args.init_weights).items()})
if args.save_init:  # compare
    np.savez(args.save_init, **{k: np.asarray(v) for k, v in model.state_dict().items()})
criterion = nn.CrossEntropyLoss()


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    else:
        return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    data = source[i:i+seq_len]
    target = source[i+1:i+1+seq_len].view(-1)
    return data, target


def train(losses):
    model.train()
    total_loss = 0.
    hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i)
        model.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output.view(-1, ntokens), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        total_loss += loss.item()
        losses.append(loss.item())  # compare
        if batch % args.log_interval == 0 and batch > 0:
            cur_loss = total_loss / args.log_interval
            print('| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | loss {:5.2f}'.format(
                1, batch, len(train_data) // args.bptt, lr, cur_loss))
            total_loss = 0


lr = args.lr
losses = []
train(losses)
if args.losses_out:  # compare
    with open(args.losses_out, 'w') as f:
        json.dump(losses, f)
