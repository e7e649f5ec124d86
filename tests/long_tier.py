"""The `long` tier: tests of 20 s to 2 min each on 2 cores, outside the default command.

`pytest -q` (CI, and the README's command) runs everything else in about 12 minutes on 2 cores;
`pytest -m long` runs these (about 15 minutes), `pytest -m "long or not long"` both. Each entry
names what covers its ground in the default tier, so that leaving it out of the default run loses
a second angle on a feature, never the feature: a sweep, a resume, a SLURM requeue, a layout or a
page each keep a faster test there. Keys are node ids or, for a parametrized test, the start of
one (`test_x[flags5-kappa`); a docs page's Python block is named by a line of its code
(`python_block`), since its id holds the line it opens at, which any line added above moves.
"""

from doc_blocks import parse


def python_block(page: str, code_line: str) -> str:
    """The node id of the test of `page`'s one Python block that has `code_line` (a whole line);
    where no block or more than one has it, an id that `tests/test_long_tier.py` reports."""
    found = [block for block in parse(page)[0] if block.language == "python"
             and code_line in block.text.splitlines()]
    name = found[0].name if len(found) == 1 else f"{page}: {len(found)} blocks with {code_line!r}"
    return f"tests/test_docs.py::test_python_block[{name}]"


LONG_TESTS = {
    # -- resume, stop and interrupt ---------------------------------------------------------------
    "tests/train/test_resume_fresh_processes.py::test_resumes_in_fresh_two_thread_processes_are"
    "_bitwise_identical": "test_resume.py's kill -9 resume, bitwise, across processes",
    "tests/train/test_resume.py::test_kill_9_then_auto_resume_is_bitwise_identical_with_ddp":
        "the same without DDP; test_distributed.py's DDP layout",
    "tests/train/test_resume.py::test_fsdp_checkpoints_staged_on_slurm_tmpdir_are_published_"
    "complete_and_resume": "test_fsdp_resume_matches_within_rounding",
    "tests/train/test_resume.py::test_iterations_to_run_stops_cleanly_and_the_chain_continues":
        "test_stop_file.py's exact resume; test_kill_9_then_auto_resume_is_bitwise_identical",
    "tests/train/test_resume.py::test_sigusr1_to_the_nproc_launcher_reaches_every_worker":
        "test_sigterm_saves_a_loadable_checkpoint_and_exits_with_the_preemption_code",
    "tests/train/test_stop_file.py::test_nproc_reports_75_while_work_remains_and_0_when_complete":
        "test_the_stop_file_checkpoints_exits_75_and_the_run_resumes_exactly",
    "tests/train/test_interrupt.py::test_a_second_ctrl_c_in_a_running_train_stops_at_once_and_"
    "the_run_resumes": "test_ctrl_c_saves_says_how_to_resume_and_the_resumed_run_matches",
    "tests/train/test_interrupt.py::test_ctrl_c_under_nproc_gives_one_message_and_exit_130":
        "test_ctrl_c_saves_says_how_to_resume_and_the_resumed_run_matches",
    "tests/train/test_run_dir_lock.py::test_a_second_run_in_a_live_directory_is_refused_and_the_"
    "live_one_goes_on": "test_under_nproc_and_torchrun_the_refusal_is_one_message_and_exit_2",
    # -- a run's identity: the other changed settings are refused by the same code --------------
    "tests/train/test_run_identity.py::test_a_resume_that_changes_the_trajectory_is_refused_"
    "listing_the_change[flags1-seed": "the lr, state_dtype, dataset and iterations cases",
    "tests/train/test_run_identity.py::test_a_resume_that_changes_the_trajectory_is_refused_"
    "listing_the_change[flags2-batch_size": "the lr, state_dtype, dataset and iterations cases",
    "tests/train/test_run_identity.py::test_a_resume_that_changes_the_trajectory_is_refused_"
    "listing_the_change[flags3-opt": "the lr, state_dtype, dataset and iterations cases",
    "tests/train/test_run_identity.py::test_a_resume_that_changes_the_trajectory_is_refused_"
    "listing_the_change[flags4-heads": "the lr, state_dtype, dataset and iterations cases",
    "tests/train/test_run_identity.py::test_a_resume_that_changes_the_trajectory_is_refused_"
    "listing_the_change[flags5-kappa": "the lr, state_dtype, dataset and iterations cases",
    "tests/train/test_run_identity.py::test_iterations_may_grow_where_the_schedule_does_not_"
    "depend_on_them": "test_extend.py (a longer total refused without --extend, and extended)",
    "tests/train/test_run_identity.py::test_the_dry_run_and_submit_refuse_the_resume_training_"
    "refuses_and_write_nothing": "test_a_resume_that_changes_the_trajectory_is_refused_listing_"
                                 "the_change; test_extend.py's dry run refusal",
    "tests/train/test_run_identity.py::test_the_process_count_may_change_when_the_global_batch_"
    "is_the_same": "test_a_refusal_under_nproc_is_said_once_and_every_process_exits_2",
    # -- layouts and parallelism ------------------------------------------------------------------
    "tests/train/test_distributed.py::test_two_processes_match_one[layout2": "layout 0 (DDP); "
    "tests/optim/test_optim_fsdp.py's every optimizer in every layout",
    "tests/train/test_distributed.py::test_two_processes_match_one[layout3": "layout 0; "
    "tests/optim/test_optim_fsdp.py (HSDP)",
    "tests/train/test_distributed.py::test_two_processes_match_one[layout1": "layout 0 (DDP); "
    "test_resume.py::test_fsdp_resume_matches_within_rounding (FSDP trained and resumed); "
    "tests/optim/test_optim_fsdp.py",
    "tests/train/test_distributed.py::test_nproc_flag_launches_torchrun_itself":
        "tests/train/test_start_decision.py's `--nproc 2` run",
    "tests/train/test_loop.py::test_compiled_blocks_train_like_eager":
        "tests/models/test_compile_autocast.py::test_compiled_blocks_agree_with_eager",
    "tests/train/test_resume.py::test_no_auto_resume_starts_afresh": "tests/train/test_history.py"
    "::test_no_auto_resume_moves_the_old_run_aside_and_the_next_start_resumes_the_new_one",
    "tests/train/test_distributed.py::test_tensor_parallel_with_fsdp_matches_one_process":
        "tests/models/test_parallelize.py::test_tensor_parallel_matches_one_process",
    "tests/optim/test_muon_sharded.py::test_four_processes_fsdp2_and_tp_with_fsdp2_on_2x2_match_"
    "one_process": "test_fsdp2_and_tensor_parallel_muon_match_one_process",
    "tests/train/test_expert_parallel.py::test_training_with_ep_size_2_equals_ddp_and_resumes":
        "test_expert_parallel_on_two_processes",
    "tests/train/test_moe_train.py::test_fsdp_over_two_processes_matches_one":
        "test_resume.py::test_fsdp_resume_matches_within_rounding; "
        "test_expert_parallel_on_two_processes",
    "tests/train/test_moe_train.py::test_trains_logs_its_routing_and_resumes_exactly_in_a_fresh_"
    "process[qwen3next": "the enoki-moe case",
    "tests/train/test_moe_train.py::test_trains_logs_its_routing_and_resumes_exactly_in_a_fresh_"
    "process[llama": "the enoki-moe case",
    "tests/train/test_moe_train.py::test_a_resume_with_other_experts_is_refused":
        "test_run_identity.py's refusals (the same comparison of the identity)",
    "tests/train/test_experts.py::test_tau_statistics_hold_each_expert_slice_and_plot_tau_adds_"
    "an_experts_panel": "test_the_experts_entry_agrees_with_the_logged_load_the_weights_and_the"
                        "_optimizer; tests/analysis/test_tau.py",
    "tests/analysis/test_tau.py::test_plot_tau_of_a_real_dana_star_run":
        "tau plots of synthetic records in the same file",
    # -- launchers: SLURM, mpirun, sweeps ---------------------------------------------------------
    "tests/launch/test_slurm_jobs.py::test_usr1_and_an_external_requeue_checkpoint_requeue_and_"
    "resume_exactly": "test_a_job_array_from_a_sweep_file_trains_each_run_in_its_own_directory; "
                      "the SIGUSR1 and requeue code is tested without SLURM in tests/train",
    "tests/launch/test_slurm_jobs.py::test_a_chain_of_three_segments_requeues_the_same_job_and_"
    "equals_an_uninterrupted_run": "test_stop_file.py's exact resume of a stopped segment",
    "tests/launch/test_slurm_jobs.py::test_a_dependency_chain_continues_through_presubmitted_"
    "successors": "test_submit.py::test_dependency_chain_and_torchrun_launch_render",
    "tests/launch/test_slurm_jobs.py::test_torchrun_per_node_trains_as_two_torchrun_workers":
        "test_a_job_array_from_a_sweep_file_trains_each_run_in_its_own_directory; "
        "tests/train/test_distributed.py's torchrun layouts",
    "tests/launch/test_slurm_jobs.py::test_a_two_node_job_trains_as_two_torchrun_workers":
        "test_a_job_array_from_a_sweep_file_trains_each_run_in_its_own_directory; "
        "tests/launch/test_env.py's node lists and ranks",
    "tests/launch/test_mpirun.py::test_two_mpirun_ranks_train_as_two_torchrun_workers":
        "tests/launch/test_env.py's reading of each launcher's environment",
    "tests/launch/test_sweep.py::test_an_edited_sweep_trains_on_where_the_schedule_allows_and_"
    "else_is_refused": "the run's own refusal of a longer total (test_extend.py, "
    "test_run_identity.py), which the sweep says",
    "tests/launch/test_sweep.py::test_a_sweep_trains_each_point_skips_complete_runs_and_resumes_"
    "interrupted_ones": "test_a_signal_to_the_sweep_stops_its_runs_where_they_can_resume[15-75]",
    "tests/launch/test_sweep.py::test_a_signal_to_the_sweep_stops_its_runs_where_they_can_resume"
    "[2-130": "the SIGTERM case",
    "tests/launch/test_sweep_lock.py::test_a_second_sweep_of_the_same_file_is_refused_naming_the_"
    "first": "test_run_dir_lock.py's refusal under nproc (the lock the sweep's is built on)",
    # -- whole trainings, exports, data -----------------------------------------------------------
    "tests/train/test_loop.py::test_default_preset_shortened_learns_shakespeare_and_samples":
        "the docs' Shakespeare commands (README.md, docs/training.md)",
    "tests/data/test_prose.py::test_prose_prepared_for_real": "test_prose.py's parts on files the "
    "tests make",
    "tests/export/test_export_command.py::test_a_sharded_checkpoint_exports_as_the_single_file_"
    "one_does": "test_a_run_exports_loads_and_computes_its_logits",
    "tests/export/test_eval_command.py::test_a_task_whose_data_cannot_be_fetched_is_one_sentence":
        "test_a_run_without_tokenizer_is_refused; test_a_run_is_scored_on_a_local_task",
    "tests/export/test_eval_command.py::test_an_unknown_task_is_one_sentence_with_the_near_names":
        "test_a_run_without_tokenizer_is_refused",
    "tests/export/test_init_from.py::test_every_fsdp_rank_starts_from_the_export":
        "test_a_run_from_an_export_starts_with_the_exported_weights; "
        "test_resume.py::test_fsdp_resume_matches_within_rounding",
    "tests/train/test_extend.py::test_a_stopped_run_reanchored_keeps_its_warm_up_and_reanchors_"
    "its_decay": "tests/optim/test_extension.py (the rules by hand in float64); "
                 "test_a_finished_run_extended_to_twice_its_steps_completes_and_resumes_bitwise",
    "tests/train/test_extend.py::test_a_finished_run_on_a_schedule_that_ends_low_is_rewarmed_"
    "and_resumes_bitwise[cos]": "its [wsd] case (the same path); tests/optim/test_extension.py "
                                "(each schedule's rewarm by hand)",
    "tests/train/test_extend.py::test_a_finished_run_on_a_schedule_that_ends_low_is_rewarmed_"
    "and_resumes_bitwise[linear]": "its [wsd] case (the same path); "
                                   "tests/optim/test_extension.py (each schedule's rewarm by hand)",
    "tests/train/test_generate.py::test_generation_from_a_sharded_checkpoint_equals_the_single_"
    "file_one": "the other generate tests, on single-file checkpoints",
    # -- the docs: pages whose commands train for minutes -----------------------------------------
    "tests/test_docs.py::test_page_commands[docs/analysis.md]": "tests/analysis (every command "
    "of the page on synthetic records)",
    "tests/test_docs.py::test_page_commands[docs/moe.md]": "tests/train/test_moe_train.py",
    "tests/test_docs.py::test_page_commands[docs/export.md]": "tests/export",
    "tests/test_docs.py::test_page_commands[docs/study-cpu.md]": "the study's records (rebuilt by "
    "its report)",
    "tests/test_docs.py::test_page_commands[docs/study-fair.md]": "the study's records",
    "tests/test_docs.py::test_page_commands[docs/study-horizon.md]": "the study's records",
    python_block("docs/models.md", "from danastar.models import ModelConfig, build_model"):
        "tests/models",
    python_block("README.md", "from danastar.optim import ADana, param_groups"):
        "tests/integrations/test_plain_loop.py",
}


def is_long(nodeid: str) -> bool:
    """Whether a test is in the long tier: its node id is a key, or starts with one that names a
    parametrized case (the key ends inside the brackets)."""
    return nodeid in LONG_TESTS or any(nodeid.startswith(key) for key in LONG_TESTS
                                       if "[" in key and not key.endswith("]"))
