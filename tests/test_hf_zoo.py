"""Hugging Face models, as people compile them: eager's results, and no more graphs than Dynamo.

Each model of tests/hf_zoo.py (tiny configurations, random weights, nothing downloaded) is
compiled whole with minicompile.compile and called twice (the second call runs the cached
entry) on fresh inputs: every output must be eager's, key by key and field by field, the KV
caches included. Its graph count is set beside torch._dynamo.explain's on the same call. Then a
forward and backward with gradients on, whose gradients must be eager's. Last, greedy decoding
with a KV cache from a compiled Llama and GPT-2: the same tokens as eager, with the growing
length handled by dynamic shapes (a few compiles, not one per token)."""
import copy
import logging
import warnings

import pytest
import torch

import minicompile

transformers = pytest.importorskip("transformers")
from hf_zoo import BREAKS_AS_DYNAMO, VOCAB, ZOO  # noqa: E402

logging.getLogger("transformers").setLevel(logging.ERROR)


def assert_same_output(got, expected, path="out", depth=0):
    """Every tensor in a model's output (ModelOutputs, tuples, caches' attributes) as eager's."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), path
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, msg=path)
        return
    if isinstance(expected, dict):
        assert list(got.keys()) == list(expected.keys()), path
        for k in expected:
            assert_same_output(got[k], expected[k], f"{path}[{k!r}]", depth + 1)
        return
    if isinstance(expected, (tuple, list)):
        assert type(got) is type(expected) and len(got) == len(expected), path
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_same_output(g, e, f"{path}[{i}]", depth + 1)
        return
    if hasattr(expected, "__dict__") and not isinstance(expected, type) and depth < 6:
        assert type(got) is type(expected), path
        for k, v in vars(expected).items():
            if isinstance(v, (torch.Tensor, dict, tuple, list)) or hasattr(v, "__dict__"):
                assert_same_output(vars(got).get(k), v, f"{path}.{k}", depth + 1)
        return
    if isinstance(expected, (int, float, bool, str, type(None))):
        assert got == expected, path


def make(name, seed=0):
    make_model, make_inputs = ZOO[name]
    torch.manual_seed(seed)
    return make_model().eval(), make_inputs


@pytest.mark.parametrize("name", list(ZOO))
def test_inference_as_eager_in_no_more_graphs_than_dynamo(name):
    model, make_inputs = make(name)
    minicompile.metrics.reset()
    compiled = minicompile.compile(model)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")              # no "runs eagerly" or "not compiled" here
        for call in range(2):
            torch.manual_seed(100 + call)
            args, kwargs = make_inputs()
            assert_same_output(compiled(*args, **kwargs), model(*args, **kwargs))
    if name not in BREAKS_AS_DYNAMO:
        assert minicompile.metrics.graphs == 1 and minicompile.metrics.graph_breaks == 0
    with torch.no_grad():
        ours = minicompile.explain(model)(*args, **kwargs)
        torch._dynamo.reset()
        theirs = torch._dynamo.explain(model)(*args, **kwargs)
        torch._dynamo.reset()
    assert ours.graph_count <= theirs.graph_count, (ours.break_reasons, theirs.graph_count)


@pytest.mark.parametrize("name", list(ZOO))
def test_forward_and_backward_as_eager(name):
    model, make_inputs = make(name)
    reference, _ = make(name)
    reference.load_state_dict(model.state_dict())
    torch.manual_seed(7)
    args, kwargs = make_inputs()

    def loss(out):
        return sum((t.float() ** 2).mean() for t in _tensors(out) if t.is_floating_point())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss(minicompile.compile(model)(*args, **kwargs)).backward()
    assert minicompile.metrics.backward_kernels > 0     # a compiled backward, not PyTorch's
    loss(reference(*args, **kwargs)).backward()
    for (pname, p), q in zip(reference.named_parameters(), model.parameters()):
        if p.grad is None:
            assert q.grad is None, pname
            continue
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=pname)


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert"])
def test_gradient_checkpointing_is_one_graph_as_eager(name):
    """model.gradient_checkpointing_enable(): a forward hook on the embeddings (their output
    made to require grad) and each layer through torch.utils.checkpoint. One graph, no break;
    the layers' values are computed again in the compiled backward; gradients are eager's."""
    model, make_inputs = make(name)
    model.train()
    model.gradient_checkpointing_enable()
    reference = copy.deepcopy(model)
    compiled = minicompile.compile(model)
    for step in range(2):
        torch.manual_seed(7 + step)
        args, kwargs = make_inputs()
        for m in (compiled, reference):
            torch.manual_seed(11 + step)         # (its dropout draws eager's numbers)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sum((t.float() ** 2).mean() for t in _tensors(m(*args, **kwargs)) if t.is_floating_point()).backward()
        scale = max(p.grad.abs().max() for p in reference.parameters() if p.grad is not None)
        for (pname, p), q in zip(reference.named_parameters(), model.parameters()):
            assert (p.grad is None) == (q.grad is None), pname
            if p.grad is not None:
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5 * scale, msg=pname)
        model.zero_grad(), reference.zero_grad()
    assert minicompile.metrics.graph_breaks == 0 and minicompile.metrics.graphs == 1
    assert minicompile.metrics.backward_kernels > 0


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _tensors(v)]
    return []


def greedy(model, ids, n=16):
    past, tokens, current = None, ids, ids
    for _ in range(n):
        out = model(current, past_key_values=past, use_cache=True)
        past = out.past_key_values
        current = out.logits[:, -1:].argmax(-1)
        tokens = torch.cat([tokens, current], 1)
    return tokens


@pytest.mark.parametrize("name", ["llama", "gpt2", "gpt_neox", "mistral"])
def test_greedy_decoding_with_a_kv_cache(name):
    model, _ = make(name)
    ids = torch.randint(0, 99, (1, 5), generator=torch.Generator().manual_seed(3))
    minicompile.metrics.reset()
    with torch.no_grad():
        assert torch.equal(greedy(minicompile.compile(model), ids), greedy(model, ids))
    # the prompt, the first step (the cache's length then changes), then one graph generic in it
    assert minicompile.metrics.graphs <= 3, minicompile.metrics.graphs


def test_a_classifier_given_labels_sets_its_problem_type_without_a_break():
    """A *ForSequenceClassification model given labels sets `config.problem_type` on its first
    call, which runs the config's field validators (a dispatch table keyed by types): one graph,
    no break, eager's loss and gradients; the second call is a graph of its own (the branch
    that set it is not taken again), as in eager."""
    def make():
        torch.manual_seed(0)
        return transformers.BertForSequenceClassification(transformers.BertConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            vocab_size=99, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).train()
    model, reference = make(), make()
    compiled = minicompile.compile(model)
    for step in range(2):
        torch.manual_seed(step)
        tokens, labels = torch.randint(0, 99, (2, 7)), torch.randint(0, 3, (2,))
        got = compiled(input_ids=tokens, labels=labels).loss
        want = reference(input_ids=tokens, labels=labels).loss
        torch.testing.assert_close(got, want)
        got.backward()
        want.backward()
        if step == 0:
            assert minicompile.metrics.graphs == 1 and minicompile.metrics.graph_breaks == 0
    assert model.config.problem_type == reference.config.problem_type == "single_label_classification"
    assert minicompile.metrics.graphs == 2 and minicompile.metrics.graph_breaks == 0
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_training_at_new_sequence_lengths_compiles_once_more(name):
    """Fine-tuning batches padded to their longest sequence: each step another length. The
    second length compiles a graph generic in it (its joint graph traced on a size symbol),
    which every later length reuses, as torch.compile's; gradients as eager's at each."""
    model, _ = make(name)
    reference, _ = make(name)
    reference.load_state_dict(model.state_dict())
    compiled = minicompile.compile(model)            # (in eval mode: no dropout to draw)
    for length in (7, 11, 5, 13):
        torch.manual_seed(length)
        ids = torch.randint(0, VOCAB, (2, length))
        kwargs = {"attention_mask": torch.ones(2, length, dtype=torch.long)} if name == "bert" else {}
        for m in (model, reference):
            m.zero_grad()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (compiled(ids, **kwargs)[0].float() ** 2).mean().backward()
        (reference(ids, **kwargs)[0].float() ** 2).mean().backward()
        for (pname, p), q in zip(reference.named_parameters(), model.parameters()):
            if p.grad is None:
                assert q.grad is None, pname
                continue
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=f"{length}: {pname}")
    assert minicompile.metrics.graphs == 2 and minicompile.metrics.graph_breaks == 0


def test_a_seq2seq_model_fine_tuned_on_batches_of_new_shapes():
    """T5 with its own loss, padded sources and ignored label positions, each batch of another
    source length, target length and then batch size: generic code for both (its kernels'
    indices over size symbols, its views of made buffers), not a graph per shape."""
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=37, num_layers=1,
                                   num_decoder_layers=1, num_heads=4, dropout_rate=0.0,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config).train()
    reference = copy.deepcopy(model)
    compiled = minicompile.compile(model)
    for batch, source, target in [(2, 9, 5), (2, 13, 7), (3, 6, 4), (4, 11, 6)]:
        ids = torch.randint(2, VOCAB, (batch, source))
        mask = torch.ones(batch, source, dtype=torch.long)
        mask[0, -2:] = 0
        labels = torch.randint(2, VOCAB, (batch, target))
        labels[1, -1] = -100
        losses = [m(input_ids=ids, attention_mask=mask, labels=labels).loss for m in (compiled, reference)]
        for loss in losses:
            loss.backward()
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-4, atol=1e-5)
        for (pname, p), q in zip(reference.named_parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=pname)
        model.zero_grad(), reference.zero_grad()
    assert minicompile.metrics.graphs == 3 and minicompile.metrics.graph_breaks == 0
