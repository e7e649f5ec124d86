"""MuonWithAdamW at its edges, held to what the other optimizers refuse (test_optim_edges.py):
complex, integer and boolean parameters refused in the same sentence, at construction and at
add_param_group; another optimizer's state refused at load_state_dict before anything is loaded,
naming where it comes from, while its own state still loads; and a group added after
construction stepped by the part it belongs to."""

import pytest
import torch

from danastar.optim import ADana, DanaStar, MuonWithAdamW


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4),
                               torch.nn.LayerNorm(4))


def named(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The parameters named as danastar's models name an embedding (routed to AdamW)."""
    return [("embed.weight" if name == "0.weight" else name, param)
            for name, param in model.named_parameters()]


def stepped(build, model: torch.nn.Module, steps: int = 1):
    optimizer = build(model)
    for _ in range(steps):
        for param in model.parameters():
            param.grad = torch.full_like(param, 0.5)
        optimizer.step()
    return optimizer


def muon(model):
    return MuonWithAdamW(named(model), lr=0.02, weight_decay=0.1)


# -- parameters the update would get wrong -------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.complex64, torch.int64, torch.bool])
@pytest.mark.parametrize("shape", [(3, 3), (3,)], ids=["matrix", "vector"])
def test_a_parameter_the_update_would_get_wrong_is_refused_in_the_others_sentence(dtype, shape):
    """Before: accepted; a complex matrix went to Muon, an integer one failed inside a step."""
    param = torch.zeros(shape, dtype=dtype)
    with pytest.raises(ValueError) as expected:
        ADana([torch.zeros(2, requires_grad=True), param])
    with pytest.raises(ValueError) as error:
        MuonWithAdamW([torch.zeros(2, 2, requires_grad=True), param], lr=0.02)
    assert str(error.value) == str(expected.value)
    optimizer = MuonWithAdamW([torch.zeros(2, 2, requires_grad=True)], lr=0.02)
    with pytest.raises(ValueError) as error:
        optimizer.add_param_group({"params": [param]})
    assert str(error.value) == str(expected.value)
    assert len(optimizer.param_groups) == 1  # nothing of the refused group is kept


# -- another optimizer's state -------------------------------------------------------------------

FOREIGN = {
    # the state's optimizer, and what the refusal says it came from
    "ADana": (lambda model: ADana(model.parameters(), lr=0.1), "ADana"),
    "DanaStar": (lambda model: DanaStar(model.parameters(), lr=0.1), "DanaStar"),
    "torch-AdamW": (lambda model: torch.optim.AdamW(model.parameters()), "torch.optim.AdamW"),
    # as many groups as MuonWithAdamW's, each of the same size: torch would have loaded it
    "torch-AdamW-two-groups": (lambda model: torch.optim.AdamW(
        [{"params": [model[1].weight]}, {"params": [model[0].weight, model[1].bias,
                                                    *model[2].parameters()]}]),
        "torch.optim.AdamW"),
    "torch-SGD": (lambda model: torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                  "torch.optim.SGD"),
    # a MuonWithAdamW whose embedding, unnamed, went to Muon: its groups are split otherwise
    "MuonWithAdamW-other-split": (lambda model: MuonWithAdamW(model.parameters(), lr=0.02),
                                  "a MuonWithAdamW over other parameters"),
}


@pytest.mark.parametrize("source", list(FOREIGN))
def test_another_optimizers_state_is_refused_before_anything_is_loaded(source):
    """Before: torch's load took any state with as many parameters per group, and the next step
    failed (KeyError) or stepped a Muon group with AdamW's hyperparameters."""
    build, origin = FOREIGN[source]
    saved = stepped(build, tiny_model()).state_dict()
    model = tiny_model()
    optimizer = stepped(muon, model)
    groups = [{key: value for key, value in group.items() if key != "params"}
              for group in optimizer.param_groups]
    state = {id(param): {key: value.clone() for key, value in optimizer.state[param].items()}
             for param in model.parameters()}
    with pytest.raises(ValueError) as error:
        optimizer.load_state_dict(saved)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"MuonWithAdamW.load_state_dict: this state dict comes from "
                              f"{origin} (per-parameter state: ")
    assert message.endswith(
        "not from MuonWithAdamW over these parameters, whose param groups are 1 of Muon (state "
        "momentum_buffer) and 1 of AdamW (state exp_avg, exp_avg_sq, max_exp_avg_sq, step); "
        "load it into the optimizer that saved it, or give MuonWithAdamW a state dict it saved")
    # nothing was loaded: the same hyperparameters and state, and it steps on
    assert [{key: value for key, value in group.items() if key != "params"}
            for group in optimizer.param_groups] == groups
    for param in model.parameters():
        kept = optimizer.state[param]
        assert all(torch.equal(kept[key], value) for key, value in state[id(param)].items())
    stepped(lambda _: optimizer, model)


def test_its_own_state_loads_and_resumes_the_same_steps():
    whole_model = tiny_model()
    stepped(muon, whole_model, steps=3)
    parts_model = tiny_model()
    saved = stepped(muon, parts_model, steps=2).state_dict()
    resumed = muon(parts_model)
    resumed.load_state_dict(saved)
    stepped(lambda _: resumed, parts_model)
    assert all(torch.equal(a, b) for a, b in zip(parts_model.parameters(),
                                                  whole_model.parameters()))
    assert resumed.muon.state is resumed.state and resumed.adamw.state is resumed.state


def test_the_refusal_sees_the_state_dict_as_the_pre_hooks_left_it():
    """A registered pre-hook may turn a state into this optimizer's: it is judged after them."""
    own = stepped(muon, tiny_model()).state_dict()
    optimizer = muon(tiny_model())
    optimizer.register_load_state_dict_pre_hook(lambda opt, state_dict: own)
    optimizer.load_state_dict(stepped(FOREIGN["ADana"][0], tiny_model()).state_dict())
    assert len(optimizer.state) == 5


def test_danastars_optimizers_name_a_muon_state_they_are_given():
    """Before: "another optimizer (its param groups hold adjust_lr_fn, amsgrad, betas, ...)"."""
    saved = stepped(muon, tiny_model()).state_dict()
    with pytest.raises(ValueError, match=r"^ADana.load_state_dict: this state dict comes from "
                                         r"MuonWithAdamW \(per-parameter state: exp_avg, "):
        stepped(lambda model: ADana(model.parameters(), lr=0.1), tiny_model()).load_state_dict(
            saved)


# -- a group added after construction -----------------------------------------------------------

def test_a_group_added_later_is_split_and_stepped_like_the_others():
    """Before: kept in param_groups, where neither Muon nor AdamW stepped it."""
    optimizer = muon(tiny_model())
    matrix = torch.nn.Parameter(torch.randn(3, 3))
    vector = torch.nn.Parameter(torch.zeros(3))
    optimizer.add_param_group({"params": [matrix, vector], "lr": 0.01})
    assert len(optimizer.param_groups) == 4  # the first two kept their places
    assert optimizer.param_groups[2]["params"] == [matrix] and "ns_steps" in \
        optimizer.param_groups[2]
    assert optimizer.param_groups[3]["params"] == [vector] and "betas" in \
        optimizer.param_groups[3]
    assert all(group["initial_lr"] == 0.01 for group in optimizer.param_groups[2:])
    before = matrix.detach().clone(), vector.detach().clone()
    matrix.grad, vector.grad = torch.ones(3, 3), torch.ones(3)
    optimizer.step()
    assert not torch.equal(matrix, before[0]) and not torch.equal(vector, before[1])
    assert set(optimizer.state) == {matrix, vector}
    with pytest.raises(ValueError, match="more than one parameter group"):
        optimizer.add_param_group({"params": [matrix]})


def test_a_group_of_a_part_it_had_none_of_builds_that_part():
    optimizer = MuonWithAdamW([torch.nn.Parameter(torch.zeros(3))], lr=0.02)
    assert optimizer.muon is None
    matrix = torch.nn.Parameter(torch.randn(2, 2))
    optimizer.add_param_group({"params": [matrix]})
    assert optimizer.muon.param_groups == [optimizer.param_groups[1]]
    matrix.grad = torch.ones(2, 2)
    optimizer.step()
    assert "momentum_buffer" in optimizer.state[matrix]


def test_named_parameters_route_by_their_names():
    """The documented ``(name, tensor)`` pairs; before: AttributeError ('tuple' has no ndim)."""
    model = tiny_model()
    optimizer = MuonWithAdamW(named(model), lr=0.02)
    assert optimizer.muon.param_groups[0]["params"] == [model[1].weight]
    assert optimizer.muon.param_groups[0]["names"] == ["1.weight"]
