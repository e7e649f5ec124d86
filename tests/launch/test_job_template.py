"""The SLURM job script is a template file with `{{name}}` holes (launch/templates/job.sbatch),
filled by `slurm.render_script`."""

import re

import pytest

from danastar.launch import slurm


def job(tmp_path, tasks: int = 1, **changes) -> slurm.Job:
    runs = [(tmp_path / f"p{i}", ["--seed", str(i)]) for i in range(tasks)]
    return slurm.Job(name="r", runs=runs, script_path=tmp_path / "s.sbatch",
                     log_dir=tmp_path / "logs", workdir=tmp_path, **changes)


def holes() -> set[str]:
    return set(re.findall(r"\{\{([a-z_]+)\}\}", slurm.JOB_TEMPLATE.read_text()))


@pytest.mark.parametrize("changes", [
    {},
    {"chain": "dependency", "launcher": "torchrun", "cluster": "tamia", "setup": ["module load x"]},
    {"tasks": 3},
])
def test_every_hole_is_filled_and_each_part_lands_in_its_place(tmp_path, changes):
    made = job(tmp_path, **changes)
    script = slurm.render_script(made)
    assert "{{" not in script
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert lines[7] == f"#SBATCH --job-name={made.name}"  # the header follows the comment
    assert f'rm -f "$RUN_DIR/{slurm.STOP_FILE}"' in lines
    assert f'elif [ "$CODE" = {slurm.PREEMPTED_EXIT_CODE} ]; then' in lines
    assert slurm.launch_command(made).splitlines()[-1] + " &" in lines
    assert script.endswith('fi\nexit "$CODE"\n')


def test_the_template_has_the_holes_render_script_fills():
    assert holes() == {"what", "created", "script_path", "then", "sbatch_lines", "workdir",
                       "max_restarts", "run_selection", "setup", "python", "successor",
                       "stop_file", "launch_command", "preempted", "continue_chain",
                       "cancel_successor"}


def test_a_misspelt_hole_is_an_error_and_a_filled_value_is_not_read_again(tmp_path):
    with pytest.raises(KeyError):
        slurm.ScriptTemplate("cd {{workdri}}").substitute(workdir="/w")
    with pytest.raises(ValueError):
        slurm.ScriptTemplate("cd {{ workdir }}").substitute(workdir="/w")
    # bash's own `$`, `${...}` and `"$@"` are text, not holes
    text = 'f() { "$@"; }; echo ${A:-${B:-0}} {{x}}'
    assert slurm.ScriptTemplate(text).substitute(x="{{y}}") == text.replace("{{x}}", "{{y}}")
    script = slurm.render_script(job(tmp_path, setup=["echo '{{python}}'"]))
    assert "echo '{{python}}'" in script.splitlines()
