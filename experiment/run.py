"""
run_cycles.py's Run: one run's settings, the steps it takes (each a ScriptStep run by the one protocol of
experiment/steps.py, resumable through its `<step>.done.json`) and its in-process measurements.

  Run.detector    reward data + a fresh reward model + its measurement (AUROC, lexicon baseline)
  Run.grpo_spec   GRPO against a detector (train_grpo.py), with the budget the other arms match
  Run.control_spec / self_play_spec    plain MLE (train.py), SPIN and DDO (train_spin.py) on that budget
  Run.run_steps   runs such ScriptSteps, in turn or at once (--parallel_arms)
  Run.evaluate    val perplexity and the frontier sweep of one generator (in process)
"""
import os
import time

from core.devices import resolve_device
from core.errors import ProjectError
from core.plots import plot_mechanism
from core.tracking import resolve_tensorboard_dir
from experiment import external, flops, frontier
from experiment.budget import OPTIMIZER_SETTINGS, continuation_settings, grpo_budget
from experiment.detection import measure_detector
from experiment.cli import parse_settings
from experiment.mauve_score import mauve_score
from experiment.measures import (copy_rate, copy_window, decode_rows, generated_blocks, natural_blocks, natural_reference,
                                 train_windows, val_perplexity)
from experiment.presets import DETECTORS, NEEDS_TRUNK, RATIO_ARMS, STEPS, argv
from experiment.runner import Command
from experiment.steps import (ONE_THREAD, Measured, ScriptStep, generator_block_size, mark_done, note_peak, read_done,
                              read_json)
from lib.checkpoint import load_model
from lib.corpus import Corpus
from lib.ensemble import load_ensemble
from reward_dataset_loader import merge_train_splits



def generator_key(gen):
    """How a generator is named in eval records: its checkpoint's absolute path, an ensemble's joined by '+'."""
    return "+".join(map(os.path.abspath, gen)) if isinstance(gen, (list, tuple)) else os.path.abspath(gen)

class Run:
    """One run of run_cycles.py: its settings, the steps it takes (each resumable through its
    `<step>.done.json`) and what its measurements keep. runner: the StepRunner of the run's scripts;
    base_data_note: set when the user consented to a base model without a train/val record
    (--base_data_unknown), whose reward data then skip the split check."""

    def __init__(self, args, preset, out_dir, runner=None, base_data_note=None):
        self.args, self.preset, self.out_dir, self.runner = args, preset, out_dir, runner
        self.base_data_note = base_data_note
        self.data_dir = args.data_dir
        # the judge's own text (--judge_holdout: a held-out part of the train split no arm sees), None: data_dir's
        self.judge_data_dir = getattr(args, "judge_data_dir", None)
        # what the verdict measures on (its val split): data_dir's, or under --data_chars the corpus it was cut from
        self.eval_data_dir = getattr(args, "eval_data_dir", None) or args.data_dir
        self.corpus = Corpus(self.eval_data_dir)  # opened once: every measurement of the run shares it
        self.extra = {s: getattr(args, f"extra_{s}").split() for s in STEPS}  # the user's raw words
        # every step's device, and its precision where the user chose one (the scripts' default is auto too)
        self.dev = argv({"device": args.device, "dtype": None if args.dtype == "auto" else args.dtype})
        self.device = resolve_device(args.device)
        self.nproc = args.nproc_per_node
        choice = preset.get("parallel_cycle0") if args.parallel_cycle0 is None else args.parallel_cycle0
        self.parallel_cycle0 = bool(choice) and self.nproc == 1  # torchrun's jobs each take every device
        choice = preset.get("parallel_arms") if args.parallel_arms is None else args.parallel_arms
        self.parallel_arms = bool(choice) and self.nproc == 1
        self.trained = set()  # the cycle-0 models train_together trained in this invocation
        self.detector_name = preset["detector"] if args.detector == "preset" else args.detector
        # the parts of the experiment this run does, and why a part is skipped
        self.control = preset["control_arm"] and not args.no_control
        self.skip_control_detector = ("--no_control_detector" if args.no_control_detector else
                                      None if preset["control_detector"] else
                                      f"preset {args.preset!r} has no control detectors")
        self.skip_final_detector = ("--no_final_detector" if args.no_final_detector else
                                    None if preset["final_detector"] else
                                    f"preset {args.preset!r} has no final stage")
        self.control_lr = args.control_learning_rate or preset["control_learning_rate"]
        self.quality_samples = args.quality_samples or preset["quality_samples"]
        self.detect_blocks = args.detect_blocks or preset["detect_blocks"]
        self.sample_len = args.sample_len  # fixed from the cycle-0 generator in base()
        self.mauve_features = args.mauve_features and os.path.abspath(args.mauve_features)  # checked by check_args
        self.eval_block_size = None
        self.null = preset["null_arm"] and not args.no_null_arm
        self.arms = set(args.arms or ())  # (check_args resolves the preset's; None where it did not run)
        # the user's arms (--arm NAME='TEMPLATE'): (name, template, limit in seconds), in their order
        self.user_arms = [(*external.parse_arm(a), getattr(args, "arm_timeout", None))
                          for a in (getattr(args, "arm", None) or [])]
        if "ratio" in self.arms and self.detector_name not in NEEDS_TRUNK:
            raise ProjectError(f"--arms ratio rewards the detector trunk's log-ratio, and the {self.detector_name!r} "
                               f"detector has no trunk beside the generator", "use --detector strong_trunk")
        if self.arms & RATIO_ARMS and not DETECTORS[self.detector_name].get("per_position"):
            raise ProjectError(f"--arms {','.join(sorted(self.arms & RATIO_ARMS))} read the detector's per-position "
                               f"log-ratios, and the {self.detector_name!r} detector has a last-token head",
                               "use --detector strong_trunk or per_position")
        self._judge_model, self.judge_rec = None, None  # judge_rec set by cycle0.judge, the model at its first use
        # the one-seed verdicts' training noise, as the A/A test measured it for the preset (aa_test.py); a smoke
        # run's sizes are not the preset's, so it has none
        self.train_noise = None if args.smoke else preset.get("aa_noise")
        self.measured = Measured()
        self.tb_root = resolve_tensorboard_dir(args.tensorboard_dir, out_dir)
        self.wandb_group = args.wandb_group or args.wandb_run_name or os.path.basename(os.path.abspath(out_dir))
        self.records = 0  # the <step>.done.json written in this invocation (mark_done): the work done
        self.kept_samples = {}  # generator -> samples.md's T = 1 rows, from finished replicates' records (archive.py)

    @property
    def judge_model(self):
        """The judge (cycle0.judge's record), loaded at its first use: a run resumed from its finished replicates'
        records (experiment/archive.py) may sweep nothing."""
        if self._judge_model is None and self.judge_rec is not None:
            self._judge_model = load_model(self.judge_rec["checkpoint"], device=self.device, require_mode="generator")[0]
        return self._judge_model

    @judge_model.setter
    def judge_model(self, model):
        self._judge_model = model

    def mark_done(self, d, step, record):
        self.records += 1
        return mark_done(d, step, record)

    def script_step(self, *args, **kwargs):
        """ScriptStep(*args, **kwargs) run as a step of the run (run_steps)."""
        return self.run_steps([ScriptStep(*args, **kwargs)])[0]

    def run_together(self, jobs, tags, timeouts=None, after=None):
        """(label, command) jobs at once, their lines tagged, at most --max_at_once at a time (the next in their order
        as a place frees, once the jobs it comes after, after[i], have ended); on a CPU one torch thread each (they
        share its cores)."""
        env = None if self.device.startswith("cuda") else ONE_THREAD
        return self.runner.run_together(jobs, tags=tags, env=env, timeouts=timeouts, at_once=self.args.max_at_once,
                                        after=after)

    def run_steps(self, steps, together=None, after=None):
        """ScriptSteps, each by the one protocol of every script step; their records, in their order. A step's
        done record if it has one; else its command (with --resume where its checkpoint is, else its fresh
        words), its summary JSON read once and its record(summary, seconds) marked done. The steps to run go
        at once where the run says so (together; None: parallel_arms), else in turn; after[i]: the indices of
        the earlier steps step i needs ended first. A step with nothing to run (its cmd None) records without
        running."""
        recs = [None if s.step is None else read_done(s.d, s.step) for s in steps]
        todo = [(i, s, s.words()) for i, (s, r) in enumerate(zip(steps, recs)) if r is None]
        run = [t for t in todo if t[2] is not None]
        if len(run) > 1 and (self.parallel_arms if together is None else together):  # tagged as their records
            at = {i: k for k, (i, _, _) in enumerate(run)}  # a step's place among those that run
            secs = self.run_together([(s.label, words) for _, s, words in run],
                                     [os.path.relpath(os.path.join(s.d, s.step or ""), self.out_dir) for _, s, _ in run],
                                     [s.timeout for _, s, _ in run],
                                     [tuple(at[j] for j in (after or {}).get(i, ()) if j in at) for i, _, _ in run])
        else:
            secs = [self.runner.run(s.label, words, s.parallel, s.timeout) for _, s, words in run]
        seconds = {i: sec for (i, _, _), sec in zip(run, secs)}
        for i, s, words in todo:
            summary = None if words is None or s.summary is None else read_json(s.summary)
            rec = s.record(None, 0.0) if words is None else s.record(summary, seconds[i])
            recs[i] = rec if s.step is None else self.mark_done(s.d, s.step, rec)
        return recs

    def track(self, step_dir):
        """The tracking flags of a training step: its TensorBoard directory under the run's tb/
        (cycle_1/grpo -> tb/cycle_1_grpo, so one TensorBoard shows the whole run) and, with
        --wandb_log, the run's W&B group with the step as the run name."""
        name = os.path.relpath(step_dir, self.out_dir).replace(os.sep, "_")
        settings = {"tensorboard_dir": "none" if self.tb_root is None else os.path.join(self.tb_root, name)}
        if self.args.wandb_log:
            settings.update(wandb_log="True", wandb_project=self.args.wandb_project, wandb_group=self.wandb_group,
                            wandb_run_name=name)
        return argv(settings)

    def val_perplexity(self, path):
        """measures.val_perplexity of a checkpoint, once per checkpoint (and version of its file) in this
        run: the base generator, the detector trunk and the judge may be one checkpoint (the issue's BPE
        run gives one Hugging Face GPT-2 for all three), and the same pass over the same file gives the same bits."""
        path = os.path.abspath(path)
        st = os.stat(path)
        key = (path, st.st_size, st.st_mtime_ns)
        if key not in self.measured.val_ppls:
            self.measured.val_ppls[key] = val_perplexity(path, self.corpus, self.device, self.args.eval_batch_size)
        else:
            print(f"{path}: val perplexity measured already in this run (the same checkpoint): reused")
        return self.measured.val_ppls[key]

    def dev_corpus(self):
        """The arms' corpus, opened once: its val split is the dev slice under --data_chars (never the verdict's)."""
        if self.measured.dev_corpus is None:
            self.measured.dev_corpus = Corpus(self.data_dir)
        return self.measured.dev_corpus

    def dev_loss(self, path):
        """A checkpoint's loss on the arms' val split, the dev slice under --data_chars (the saturation check)."""
        return val_perplexity(path, self.dev_corpus(), self.device, self.args.eval_batch_size)[0]

    def check_ratio_windows(self, N):
        """--arms sir, logit, ptx score the val windows and samples with the detector: refuse, as soon as
        the first reward dataset exists (before GRPO and those arms run), windows longer than its blocks
        (N, the reward-data step's record; None in records of older runs: the SIR step checks then)."""
        if N is not None and self.arms & RATIO_ARMS and max(self.eval_block_size, self.sample_len) > N:
            raise ProjectError(f"--arms {','.join(sorted(self.arms & RATIO_ARMS))} score val windows of "
                               f"{self.eval_block_size} tokens and samples of {self.sample_len} with a detector of "
                               f"{N}-token blocks", "drop sir, logit and ptx from --arms for this preset, or make "
                               "the reward data's blocks as long (--extra_reward_data='--block_size ...')")

    # ---- measurements
    def reference(self):
        """The natural val text's sample statistics (the reference lines)."""
        ref = read_done(self.out_dir, "reference")
        want = {"samples": self.quality_samples, "sample_len": self.sample_len, "seed": self.args.seed}
        if ref is None or any(ref.get(k) != v for k, v in want.items()):
            ref = self.mark_done(self.out_dir, "reference",
                                 natural_reference(self.corpus, self.quality_samples, self.sample_len, self.args.seed))
        return ref

    def evaluate(self, d, gen, label):
        """Val perplexity and sample quality of one generator, the same way for every generator (gen: a checkpoint,
        or a list of them: their ensemble, lib/ensemble.py)."""
        ev = read_done(d, "eval")
        # (re)computed when missing, from an older version, or made with other sample settings
        want = {"generator": generator_key(gen), "samples": self.quality_samples, "sample_len": self.sample_len,
                "seed": self.args.seed, "temps": self.args.temps, "mauve_features": self.mauve_features,
                "judge": self.judge_rec["checkpoint"]}
        twin = self.measured.sweeps.get(want["generator"])  # the same checkpoint swept elsewhere in this run
        if (ev is None or any(ev.get(k) != v for k, v in want.items())) and twin is not None \
                and all(twin.get(k) == v for k, v in want.items()):
            print(f"{label}: {gen} was evaluated already in this run (the same checkpoint): its sweep is reused")
            ev = self.mark_done(d, "eval", twin)
        if ev is None or any(ev.get(k) != v for k, v in want.items()):
            ev = self.mark_done(d, "eval", self.sweep(gen, label))
        self.measured.sweeps[want["generator"]] = ev
        return ev

    def sweep(self, gen, label):
        """The eval record of one generator: the frontier sweep over --temps (its T = 1 point is the
        generator's own measurement), MAUVE with --mauve_features, the settings it was made with."""
        key = generator_key(gen)
        print(f"{label}: evaluating {key} (full val split, {self.quality_samples} samples of "
              f"{self.sample_len} tokens, at T = {', '.join(f'{t:g}' for t in self.args.temps)})", flush=True)
        t0 = time.time()
        model = load_ensemble(gen, self.device) if isinstance(gen, (list, tuple)) else \
            load_model(gen, device=self.device, require_mode="generator")[0]
        rows = {}
        curve = frontier.sweep(model, self.corpus, self.args.temps, self.quality_samples, self.sample_len,
                               self.args.seed, self.device, eval_batch_size=self.args.eval_batch_size,
                               eval_block_size=self.eval_block_size, keep_examples=True, judge=self.judge_model,
                               rows=rows)
        self.measured.samples[key] = {(self.quality_samples, self.sample_len, self.args.seed): rows[1.0]}
        n = min(copy_window(self.corpus.tokenizer.vocab_size), self.sample_len - 1)  # (a smoke run's short samples)
        if self.measured.train_windows is None:  # the arms' own train text (under --data_chars, the D characters)
            self.measured.train_windows = train_windows(Corpus(self.data_dir).train, n)
        ev = {"generator": key, **frontier.eval_fields(curve), "temps": self.args.temps,
              "mauve_features": self.mauve_features, "mauve": self.mauve(model),
              "copy_rate": copy_rate(rows[1.0], self.measured.train_windows, n), "copy_window": n,
              "judge": self.judge_rec["checkpoint"], "seconds": round(time.time() - t0, 1)}
        note_peak(f"evaluating {label}")
        return ev

    def mauve(self, model):
        """MAUVE of the generator's T = 1 samples (generated_blocks, the same as the sweep's at T = 1)
        against the natural windows their prompts come from; None without --mauve_features."""
        if self.mauve_features is None:
            return None
        n, L, seed, val = self.quality_samples, self.sample_len, self.args.seed, self.corpus.val
        gen_rows = generated_blocks(model, val, n, L, seed, self.device)
        tok = self.corpus.tokenizer
        nat_rows = natural_blocks(val, n, L, seed)  # the windows whose first token prompted each sample
        out = mauve_score(decode_rows(tok, gen_rows), decode_rows(tok, nat_rows), self.mauve_features, self.device)
        print(f"MAUVE (T = 1, {n} samples, {out['buckets']} buckets): {out['mauve']:.4f}", flush=True)
        return out

    # ---- a fresh detector
    def detector(self, d, gen, seed, label, replay=(), trunk=None, recipe=None, data_from=None, natural_dir=None,
                 seen_dir=None):
        """Reward dataset + fresh reward model on `gen`'s samples in d, then its measurements.
        replay: earlier cycles' reward data directories whose train splits the reward model also
        learns (--replay); trunk: the replicate's detector trunk record (the recipes that read one); recipe:
        another detector recipe than the run's (an arm's own detector); data_from: the directory whose reward
        data (of gen) it trains on instead of making its own; natural_dir: the data directory whose train split gives
        the natural text (the heldout arm's, which gen never trained on; default the arms'); seen_dir: the one whose
        train split gen trained on, the mechanism's "train" text (default the arms'). Returns (reward_model record with
        the detector's FLOPs, detect record)."""
        os.makedirs(d, exist_ok=True)
        rd = self.reward_data(data_from or d, gen, seed, label, natural_dir)
        self.check_ratio_windows(rd.get("block_size"))
        rd_dir = os.path.join(data_from or d, "reward_data")  # (not rd["dir"]: a run directory may have been moved)
        if replay:
            rd_dir = self.replay_data(d, rd_dir, replay)
        rm = self.reward_model(d, gen, rd_dir, seed, label, trunk, recipe)
        # what this detector cost: its reward data and its training (run_cycles adds it to the arms using it)
        rm = {**rm, "detector_flops": flops.total({"data": rd.get("flops"), "model": rm.get("flops")}),
              "block_size": rd.get("block_size")}  # N, the GRPO steps' sequence length
        det = read_done(d, "detect")
        # a record without the measurements added since (train_mae; the mechanism, issue 78), or whose mechanism read
        # other train text than the seen_dir asked for, is measured again (the arms' own text: as recorded, so a run
        # resumed from another checkout keeps its records)
        if det is None or det.get("auroc_blocks") != self.detect_blocks or not {"train_mae", "mechanism"} <= set(det) \
                or (seen_dir is not None and det.get("seen_text") != os.path.abspath(seen_dir)):
            print(f"{label}: measuring the detector (AUROC on {self.detect_blocks} + {self.detect_blocks} "
                  f"blocks, lexicon baseline)", flush=True)
            t0 = time.time()
            det = measure_detector(os.path.join(d, "reward_model"), rd_dir, gen, self.corpus, self.device,
                                   self.detect_blocks, self.args.seed, known_blocks=self.measured.samples.get(os.path.abspath(gen)),
                                   feature_cache=self.measured.det_features, lexicon_data=self.data_dir,
                                   seen_data=seen_dir)
            det = self.mark_done(d, "detect", {**det, "seconds": round(time.time() - t0, 1)})
            plot_mechanism(det["mechanism"], os.path.join(d, "mechanism.png"), f"{label}: what the detector rewards")
            note_peak(f"measuring {label}'s detector")
        if rm.get("val_mae") is not None and rm["val_mae"] >= rm["const_mae"] - 1e-4:
            print(f"WARNING: {label}'s reward model is no better than the constant 0.5 predictor; "
                  f"try more reward data (--extra_reward_data='--samples_per_chunk 10'), the per-position "
                  f"detector (--detector per_position) or a larger base model")
        return rm, det

    def reward_data(self, d, gen, seed, label, natural_dir=None):
        """prepare_reward_data.py on gen in d/reward_data; its record holds the blocks' length N. natural_dir: as
        detector's (its train split is not gen's, by design: the split check is overridden for it alone)."""
        rd_dir, natural = os.path.join(d, "reward_data"), natural_dir or self.data_dir
        cmd = ["prepare_reward_data.py"] \
            + argv({"model_path": gen, "input_mode": "binary", "train_bin": os.path.join(natural, "train.bin"),
                    "val_bin": os.path.join(self.data_dir, "val.bin"), "output_dir": rd_dir, "seed": seed}) \
            + self.dev + argv(self.preset["reward_data"]) \
            + argv({"allow_split_mismatch": self.base_data_note is not None or natural_dir is not None}) \
            + self.extra["reward_data"]
        resume = rd_dir if os.path.isdir(rd_dir) and os.listdir(rd_dir) else None
        return self.script_step(d, "reward_data", f"{label}: reward dataset", cmd,
                                os.path.join(rd_dir, "reward_data_summary.json"),
                                lambda s, secs: {"dir": rd_dir, "generator": gen, "seconds": secs,
                                                 "flops": flops.step_reward_data(s), "block_size": s["block_size"]},
                                resume=resume)

    def reward_model(self, d, gen, rd_dir, seed, label, trunk=None, recipe=None):
        """A fresh reward model (the --detector recipe, or `recipe`; on the trunk of the record `trunk` where it
        reads one) on the reward data in rd_dir, in d/reward_model."""
        rm_dir, name = os.path.join(d, "reward_model"), recipe or self.detector_name
        recipe = {**DETECTORS[name], "init_trunk_from": trunk and name in NEEDS_TRUNK and trunk["checkpoint"]}
        cmd = ["train_reward_model.py"] + argv({"model_path": gen, "data_dir": rd_dir, "out_dir": rm_dir, "seed": seed}) \
            + self.dev + self.track(rm_dir) + argv(self.preset["reward_model"]) + argv(recipe) \
            + self.extra["reward_model"]
        return self.script_step(d, "reward_model", f"{label}: reward model ({name} detector)", cmd,
                                os.path.join(rm_dir, "reward_summary.json"),
                                lambda s, secs: {**s, "detector": name, "seconds": secs,
                                                 "flops": flops.step_reward_model(s)},
                                resume=os.path.join(rm_dir, "reward_last.pt"))

    def replay_data(self, d, rd_dir, replay):
        """The reward data with earlier generators' train samples added (val: the current generator's)."""
        out = os.path.join(d, "reward_data_replay")
        if read_done(d, "replay") is None:
            print(f"replay: the detector also trains on {', '.join(replay)}", flush=True)
            merge_train_splits(rd_dir, list(replay), out)
            self.mark_done(d, "replay", {"dir": out, "from": list(replay)})
        return out

    # ---- the adversarial arm
    def grpo_spec(self, cdir, gen, rm, seed, label, null=False, settings=None, data_dir=None):
        """GRPO against detector rm in cdir/grpo (None: an arm whose settings give the reward, --arms ratio);
        null: the null arm's run (--shuffle_rewards); settings: an arm's own train_grpo.py settings, after the
        preset's and the user's (--arms logit, ptx, ratio); data_dir: its prompts' text (default the arms'). Its
        record carries the budget the control, SPIN and DDO arms match. The ScriptStep (run_steps runs it)."""
        g_dir = os.path.join(cdir, "grpo")
        words = self.grpo_words(null, settings)
        cmd = ["train_grpo.py"] \
            + argv({"model_path": gen, "reward_model_path": rm and rm["checkpoint"], "out_dir": g_dir,
                    "data_dir": data_dir or self.data_dir, "seed": seed}) + self.dev + self.track(g_dir) + words

        def record(summary, secs):  # the run's facts (its summary) beside the settings it was given (parsed)
            parsed = self.settings_of(words)
            return {**summary, "seconds": secs, "budget": grpo_budget(summary, parsed),
                    "flops": flops.step_rl({**parsed, **summary}, "grpo")}
        return ScriptStep(cdir, "grpo", f"{label}: GRPO", cmd, os.path.join(g_dir, "grpo_summary.json"), record,
                          resume=os.path.join(g_dir, "ckpt.pt"))

    def grpo_words(self, null=False, settings=None):
        """A GRPO step's settings words for train_grpo.py: the preset's, the user's (--extra_grpo), the null
        arm's (--extra_null), an arm's own."""
        return argv(self.preset["grpo"]) + self.extra["grpo"] \
            + (argv({"shuffle_rewards": True}) + self.extra["null"] if null else []) + argv(settings or {})

    def settings_of(self, words):
        """train_grpo.py's settings of a GRPO step as its own parser reads its words (cli.parse_settings):
        what its budget and FLOPs are read from, rather than its summary."""
        return parse_settings("train_grpo.py", list(words))

    # ---- the self-play arms: SPIN and DDO
    def self_play_settings(self, objective, steps):
        """train_spin.py's settings of the SPIN or the DDO arm (run_cycles' --spin_* and --ddo_* flags)."""
        a = self.args
        if objective == "spin":
            return {"learning_rate": a.spin_learning_rate, "beta": a.spin_beta, "nll_coef": a.spin_nll_coef}
        return {"objective": "ddo", "learning_rate": a.ddo_learning_rate, "ddo_alpha": a.ddo_alpha,
                "ddo_beta": a.ddo_beta, "rounds": min(a.ddo_rounds, steps)}

    def self_play_spec(self, d, gen, budget, seed, label, objective="spin", over=None):
        """SPIN or DDO (train_spin.py --objective) from the arm's previous generator for the GRPO step's
        budget: as many steps, GRPO's rows per step and seq_len, and the same seed, so every step draws
        the prompt length GRPO's step drew (rl_data.step_prompt_len) and generates as many completion
        tokens (DDO's rounds draw theirs when each round starts); over: train_spin.py settings over the arm's own (a
        grid point, experiment/tuning.py). In d/<objective>."""
        s_dir = os.path.join(d, objective)
        steps = int(budget["steps"])
        own = self.self_play_settings(objective, steps)
        settings = {"model_path": gen, "out_dir": s_dir, "data_dir": self.data_dir, "seed": seed,
                    "seq_len": budget["seq_len"], "max_steps": steps, "prompts_per_step": budget["rows_per_step"],
                    **own, "learning_rate": float(own["learning_rate"] or budget["learning_rate"]),
                    "eval_interval": steps, "save_interval": max(1, steps // 3),
                    **{k: float(budget[k]) for k in OPTIMIZER_SETTINGS if k in budget}, **(over or {})}
        cmd = ["train_spin.py"] + argv(settings) + self.dev + self.track(s_dir) + self.extra[objective]
        if budget["updates"] == 0:  # GRPO made no update: neither does this arm
            cmd, record = None, lambda s, secs: {"checkpoint": gen, "updates": 0, "completion_tokens": 0, "seconds": 0.0}
        else:
            record = lambda s, secs: {**s, "seconds": secs, "flops": flops.step_rl(s, objective)}  # noqa: E731
        return ScriptStep(d, objective, f"{label}: {objective.upper()} ({steps} steps x {budget['rows_per_step']} "
                          f"prompts)", cmd, os.path.join(s_dir, f"{objective}_summary.json"), record,
                          resume=os.path.join(s_dir, "ckpt.pt"), parallel=False)

    # ---- the control arm
    def control_budget(self, gen, budget):
        """(updates, GRPO's seq_len N, learning rate, block size T, rows per process) of MLE from gen on the GRPO
        step's budget: as many updates, about its completion tokens per update."""
        updates, N = int(budget["updates"]), int(budget["seq_len"])
        lr = self.control_lr or float(budget["learning_rate"])
        # train.py crops a pretrained model to a shorter --block_size; keep the generator's own
        # context (so every generator is scored alike) when GRPO's seq_len is shorter than it
        T = N if updates == 0 else max(N, generator_block_size(gen))
        rows = max(1, round(budget["tokens_per_step"] / T))
        per_proc = max(1, round(rows / self.nproc))  # train.py's --batch_size counts per process
        return updates, N, lr, T, per_proc

    def control_spec(self, d, gen, budget, seed, label):
        """Plain MLE from the control arm's previous generator for the GRPO step's budget:
        as many optimizer updates, batch_size * block_size ~ its completion tokens per step,
        block_size = its seq_len, a constant learning rate, no early stopping."""
        updates, N, lr, T, per_proc = self.control_budget(gen, budget)
        m_dir = os.path.join(d, "mle")

        def command():  # None when GRPO made no update: neither does the control
            if updates == 0:
                return None
            if T != N:
                print(f"note: {label}'s control trains in blocks of {T} tokens, the generator's context (GRPO's "
                      f"sequences had {N}), with about as many tokens per update")
            settings = {"out_dir": m_dir, "data_dir": self.data_dir, "seed": seed,
                        **continuation_settings(budget, lr, T, per_proc, self.nproc)}
            return ["train.py"] + argv(settings) + self.dev + self.track(m_dir) + argv(self.preset["control"]) \
                + self.extra["control"]

        def record(summary, secs):  # last.pt is the final state (ckpt.pt is train.py's best estimate, maybe iter 0)
            if updates == 0:
                return {"checkpoint": gen, "iters": 0, "batch_size": 0, "block_size": N, "tokens": 0,
                        "learning_rate": lr, "seconds": 0.0}
            return {"checkpoint": os.path.abspath(os.path.join(m_dir, "last.pt")), "iters": updates,
                    "batch_size": per_proc * self.nproc, "block_size": T,
                    "tokens": updates * per_proc * self.nproc * T, "learning_rate": lr,
                    "train_loss_final": summary["train_loss_final"], "seconds": secs,
                    "flops": flops.step_train(summary)}
        # a killed step resumes from its last.pt (written at iteration 0 and at the end)
        return ScriptStep(d, "mle", f"{label}: control MLE ({updates} updates x {per_proc * self.nproc} x {T} "
                          f"tokens)", command, os.path.join(m_dir, "train_summary.json"), record,
                          resume=os.path.join(m_dir, "last.pt"), fresh=argv({"init_from": gen}))

    # ---- a user's arm (--arm NAME='TEMPLATE')
    def command_spec(self, d, gen, budget, seed, label, arm, rm=None):
        """The user's command of arm (name, template, its limit in seconds), filled in from gen with the same-budget
        control's budget, run in d; its model read back from d/out (external.find_model), checked against the
        run's tokenizer and context, with the FLOPs it reports (else None: unknown)."""
        name, template, timeout = arm
        updates, _, lr, T, per_proc = self.control_budget(gen, budget)
        out, rows = os.path.join(d, "out"), per_proc * self.nproc
        values = {"generator": gen, "out_dir": out, "data_dir": self.data_dir, "seed": seed, "updates": updates,
                  "tokens": updates * rows * T, "batch_size": rows, "block_size": T, "learning_rate": lr,
                  "device": self.args.device, "detector": rm and rm.get("checkpoint"),
                  "resume": "--resume" if os.path.isdir(out) and os.listdir(out) else ""}
        what = f"arm {name}"

        def record(_, secs):
            if updates == 0:  # GRPO made no update: neither does this arm
                return {"checkpoint": gen, "flops": 0.0, "command": None, "budget": values, "seconds": 0.0}
            path = external.find_model(out, what)
            external.check_generator(path, self.corpus, self.eval_block_size, what)
            return {"checkpoint": path, "flops": external.reported_flops(out, what), "command": words,
                    "budget": values, "seconds": secs}
        words = external.fill(template, values)
        return ScriptStep(d, "command", f"{label}: {name} arm ({updates} updates x {rows} x {T} tokens)",
                          None if updates == 0 else Command(words), None, record, timeout=timeout)
