"""TabGPT written again in torch, with the same parameter names, as the tests' oracle.

Only what the comparison needs: no validation, no sampling. ``load_from`` copies one of our
models' ``state_dict`` in, name for name.
"""
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class Tokenizer(nn.Module):
    def __init__(self, n_numerical, cardinalities, d):
        super().__init__()
        self.n_numerical, self.cardinalities = n_numerical, list(cardinalities)
        if n_numerical:
            self.numerical_weight = nn.Parameter(torch.empty(n_numerical, d))
            self.numerical_bias = nn.Parameter(torch.empty(n_numerical, d))
        if cardinalities:
            self.category_embeddings = nn.Embedding(sum(cardinalities), d)
            self.categorical_bias = nn.Parameter(torch.empty(len(cardinalities), d))
            self.offsets = torch.tensor(np.concatenate([[0], np.cumsum(cardinalities)[:-1]]))
        self.missing_tokens = nn.Parameter(torch.empty(n_numerical + len(cardinalities), d))

    def forward(self, x_num, x_cat):
        parts, missing = [], []
        if self.n_numerical:
            gone = torch.isnan(x_num)
            filled = torch.where(gone, torch.zeros_like(x_num), x_num)
            parts.append(filled[:, :, None] * self.numerical_weight + self.numerical_bias)
            missing.append(gone)
        if self.cardinalities:
            gone = x_cat < 0
            rows = torch.where(gone, torch.zeros_like(x_cat), x_cat) + self.offsets
            parts.append(self.category_embeddings(rows) + self.categorical_bias)
            missing.append(gone)
        tokens = torch.cat(parts, dim=1)
        gone = torch.cat(missing, dim=1)[:, :, None]
        return torch.where(gone, self.missing_tokens.expand_as(tokens), tokens)


class FeedForward(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.activation, self.hidden = config.activation, config.d_ffn
        widen = 2 if config.activation == "reglu" else 1
        self.linear_first = nn.Linear(config.d_token, widen * self.hidden)
        self.dropout = nn.Dropout(config.ffn_dropout)
        self.linear_second = nn.Linear(self.hidden, config.d_token)

    def forward(self, x):
        h = self.linear_first(x)
        if self.activation == "reglu":
            a, b = h.chunk(2, dim=-1)
            h = a * F.relu(b)
        else:
            h = F.gelu(h) if self.activation == "gelu" else F.relu(h)
        return self.linear_second(self.dropout(h))


class Block(nn.Module):
    def __init__(self, config, index):
        super().__init__()
        d = config.d_token
        self.attention_norm = nn.Identity() if index == 0 else \
            nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.attention = nn.MultiheadAttention(d, config.n_heads, config.attention_dropout,
                                               batch_first=True)
        self.ffn_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.residual_dropout = nn.Dropout(config.residual_dropout)

    def forward(self, x):
        h = self.attention_norm(x)
        x = x + self.residual_dropout(self.attention(h, h, h, need_weights=False)[0])
        return x + self.residual_dropout(self.ffn(self.ffn_norm(x)))


class Backbone(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.tokenizer = Tokenizer(config.n_numerical, config.categorical_cardinalities,
                                   config.d_token)
        self.cls_token = nn.Parameter(torch.empty(1, 1, config.d_token))
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.final_norm = nn.LayerNorm(config.d_token, eps=config.layer_norm_eps)

    def encode(self, tokens):
        x = torch.cat([self.cls_token.expand(len(tokens), 1, -1), tokens], dim=1)
        for block in self.blocks:
            x = block(x)
        return self.final_norm(x)


class Classifier(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.tabgpt = Backbone(config)
        self.classifier = nn.Linear(config.d_token, config.num_labels)

    def forward(self, x_num, x_cat, labels):
        hidden = self.tabgpt.encode(self.tabgpt.tokenizer(x_num, x_cat))
        logits = self.classifier(F.relu(hidden[:, 0]))
        if self.config.problem_type == "regression":
            return logits, F.mse_loss(logits, labels.reshape(logits.shape).to(logits.dtype))
        return logits, F.cross_entropy(logits, labels)


class PreTraining(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        d, n_num = config.d_token, config.n_numerical
        self.tabgpt = Backbone(config)
        self.mask_tokens = nn.Parameter(torch.empty(config.n_features, d))
        if n_num:
            self.numerical_decoder_weight = nn.Parameter(torch.empty(n_num, d))
            self.numerical_decoder_bias = nn.Parameter(torch.empty(n_num))
        self.categorical_decoders = nn.ModuleList(
            nn.Linear(d, c) for c in config.categorical_cardinalities)
        if config.contrastive_weight:
            self.contrastive_projection = nn.Module()
            self.contrastive_projection.dense = nn.Linear(d, d)
            self.contrastive_projection.output = nn.Linear(d, d)

    def forward(self, x_num, x_cat, cell_mask, source_rows=None):
        """The loss: squared errors and cross-entropies summed over the masked observed cells,
        over their number; plus, given ``source_rows``, ``contrastive_weight`` times SCARF's
        InfoNCE between each row and its twin whose cell (i, j) is cell (source_rows[i, j], j).
        Returns (loss, contrastive loss or None)."""
        masked = self.masked_cell_loss(x_num, x_cat, cell_mask)
        if source_rows is None:
            return masked, None
        n_num = self.config.n_numerical
        x_num_twin = x_num[source_rows[:, :n_num], torch.arange(n_num)]
        x_cat_twin = x_cat[source_rows[:, n_num:], torch.arange(x_cat.shape[1])]
        embed = [self.tabgpt.encode(self.tabgpt.tokenizer(a, b))[:, 0]
                 for a, b in ((x_num, x_cat), (x_num_twin, x_cat_twin))]
        head = self.contrastive_projection
        anchors, positives = (F.normalize(head.output(F.relu(head.dense(e))), dim=-1)
                              for e in embed)
        logits = anchors @ positives.T / self.config.contrastive_temperature
        contrastive = F.cross_entropy(logits, torch.arange(len(logits)))
        return masked + self.config.contrastive_weight * contrastive, contrastive

    def masked_cell_loss(self, x_num, x_cat, cell_mask):
        n_num = self.config.n_numerical
        tokens = self.tabgpt.tokenizer(x_num, x_cat)
        tokens = torch.where(cell_mask[:, :, None], self.mask_tokens.expand_as(tokens), tokens)
        hidden = self.tabgpt.encode(tokens)
        total, count = hidden.new_zeros(()), 0
        if n_num:
            prediction = (hidden[:, 1:1 + n_num] * self.numerical_decoder_weight).sum(-1) \
                + self.numerical_decoder_bias
            chosen = cell_mask[:, :n_num] & ~torch.isnan(x_num)
            total = total + ((prediction - x_num)[chosen] ** 2).sum()
            count += int(chosen.sum())
        for j, decoder in enumerate(self.categorical_decoders):
            chosen = cell_mask[:, n_num + j] & (x_cat[:, j] >= 0)
            logits = decoder(hidden[chosen][:, 1 + n_num + j])
            total = total + F.cross_entropy(logits, x_cat[chosen, j], reduction="sum")
            count += int(chosen.sum())
        return total / max(count, 1)


def load_from(theirs, ours, dtype):
    """Copy our model's parameters into the torch model (same names), in ``dtype``."""
    state = {name: torch.from_numpy(np.array(value)) for name, value in ours.state_dict().items()}
    theirs.to(dtype)
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert not missing, missing
    return theirs


def assert_gradients_equal(ours, theirs, rtol, atol):
    their_grads = dict(theirs.named_parameters())
    for name, parameter in ours.named_parameters():
        expected = their_grads[name].grad
        assert parameter.grad is not None, name
        np.testing.assert_allclose(parameter.grad, expected.numpy(), rtol=rtol, atol=atol,
                                   err_msg=name)

