"""SteerPrompt and AttributePrompt through the daemon against python3-torch: a Hugging Face GPT-2 checkpoint (latentd
runs it natively) and a TopK SAE in the SAELens layout, an EXTRACT of its latents; then a prompt
steered and ablated through the daemon equals GPT-2's forward pass written in Python (the HF
parity test's) with x + (z' - z) W_dec spliced in at the hook: the per-position losses, the next
token's distribution, the greedy continuations of both runs; and a prediction's attribution to
the latents equals autograd's gradient of it at the hook times each latent's decoder row (and
so does the attribution of a later SAE's latent to an earlier SAE's latents). The
same for a cross-layer transcoder in circuit-tracer's layout, whose latents write several
layers."""

import os
import sys
import unittest

import grpc
import numpy
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from extract_test_util import (write_hf_checkpoint, write_safetensors,  # noqa: E402
                               write_topk_sae)
from test_hf_gpt2_parity import (CTX, D, LAYERS, POSITIONS, VOCAB, Gpt2,  # noqa: E402
                                 gpt2_config, random_gpt2_weights)

from harness import DaemonTestCase  # noqa: E402
from latentd.v1 import jobs_pb2  # noqa: E402

HOOK, D_SAE, K = "blocks.1.hook_resid_post", 96, 8


def encode(w, x):
    """SAELens' TopK: the k largest pre-activations, ReLU'd."""
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    top = pre.topk(K, dim=-1)
    return torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())


class SteeringTest(DaemonTestCase):
    def test_steering_and_attribution_are_gpt2s_own_in_python(self):
        weights, cfg = random_gpt2_weights(seed=2), gpt2_config()
        model_dir = os.path.join(self.tmp, "gpt2")
        write_hf_checkpoint(model_dir, cfg, weights)
        sae = write_topk_sae(os.path.join(self.tmp, "sae"), D, D_SAE, K, seed=3, bias=0.05)
        ids = numpy.random.default_rng(5).integers(0, VOCAB, size=8 * CTX).astype(numpy.uint16)
        numpy.save(os.path.join(self.tmp, "tokens.npy"), ids)
        daemon = self.start_daemon(devices="cpu:1", extra_args=["--data_roots=" + self.tmp])
        c = daemon.client()
        job = c.wait(c.submit("EXTRACT", {
            "model": {"huggingface": {"path": model_dir}}, "hookName": HOOK,
            "tokens": {"path": os.path.join(self.tmp, "tokens.npy"), "contextLength": CTX},
            "sae": {"path": os.path.join(self.tmp, "sae")}, "mode": "SPARSE",
            "moreOutputs": [{"hookName": "blocks.0.hook_resid_post",
                             "sae": {"path": os.path.join(self.tmp, "sae")}}]}).id)
        self.assertEqual(job.state, jobs_pb2.SUCCEEDED, job.message)
        dataset = job.result.extract.dataset_id
        layer0 = job.result.extract.more_outputs[0].dataset_id

        gpt2 = Gpt2(weights, cfg)
        prompt = [int(t) for t in ids[:7]]
        with torch.no_grad():
            z = encode(sae, gpt2(torch.tensor([prompt]))[HOOK])[0]
        strongest = int(z[3].argmax())  # the largest latent on position 3
        steer_along = (strongest + 1) % D_SAE

        def splice(interventions):
            """x + (z' - z) W_dec, z' the interventions (latent, mode, value[, positions]) made
            of z in order, at every position of the sequence unless they name positions."""
            def f(x):
                z = encode(sae, x)
                changed = z.clone()
                for latent, mode, value, *positions in interventions:
                    where = positions[0] if positions else slice(None)
                    column = changed[0, where, latent]
                    changed[0, where, latent] = {"set": torch.full_like(column, value),
                                                 "add": column + value,
                                                 "scale": column * value}[mode]
                return x + (changed - z) @ sae["W_dec"]
            return f

        steering = [(strongest, "set", 0.0, [3]), (steer_along, "add", 4.0)]

        def run(tokens, interventions):
            """Per-position losses and the last position's log-probabilities."""
            with torch.no_grad():
                spliced = {HOOK: splice(interventions)} if interventions else None
                final = gpt2(torch.tensor([tokens]), spliced)["final"]
                logits = gpt2.layer_norm("ln_f", final)[0] @ weights["wte.weight"].T
            log_probs = logits.log_softmax(-1)
            losses = -log_probs[:-1].gather(1, torch.tensor(tokens[1:]).unsqueeze(1)).squeeze(1)
            return losses, log_probs[-1]

        got = c.steer_prompt(dataset, prompt, steering, new_tokens=5, top_tokens=5)
        self.assertFalse(got.bos_prepended)
        self.assertEqual(list(got.prompt), prompt)
        for name, answer, interventions in (("clean", got.clean, None),
                                            ("steered", got.steered, steering)):
            losses, last = run(prompt, interventions)
            numpy.testing.assert_allclose(answer.token_losses, losses.numpy(), atol=1e-4,
                                          err_msg=name)
            self.assertAlmostEqual(answer.mean_loss, float(losses.mean()), places=4)
            top = last.exp().topk(5)
            self.assertEqual([t.token_id for t in answer.next], top.indices.tolist(), name)
            numpy.testing.assert_allclose([t.probability for t in answer.next],
                                          top.values.numpy(), atol=1e-5, err_msg=name)
            # Greedy: each run continues with its own most likely token, the steered one with
            # the latent still pushed at the new positions.
            tokens = list(prompt)
            for _ in range(5):
                tokens.append(int(run(tokens, interventions)[1].argmax()))
            self.assertEqual(list(answer.generated), tokens[len(prompt):], name)
        clean_lp, steered_lp = run(prompt, None)[1], run(prompt, steering)[1]
        kl = float((clean_lp.exp() * (clean_lp - steered_lp)).sum())
        self.assertGreater(kl, 1e-4)
        self.assertAlmostEqual(got.kl_divergence, kl, delta=1e-4 * kl + 1e-6)
        got_kl = got.kl_divergence
        self.assertEqual(got.most_increased[0].token_id,
                         int((steered_lp.exp() - clean_lp.exp()).argmax()))
        # The latents' values over the prompt, as the SAE encodes the clean run.
        self.assertEqual([v.latent for v in got.latent_values], sorted([strongest, steer_along]))
        by_latent = {v.latent: list(v.values) for v in got.latent_values}
        numpy.testing.assert_allclose(by_latent[strongest], z[:, strongest].numpy(), atol=1e-5)

        # A strength sweep of the first intervention: a run per value, each the model with
        # that value by hand (the second intervention as given).
        swept = c.steer_prompt(dataset, prompt, steering, new_tokens=3, sweep=[0.5, -2.0])
        self.assertEqual([s.value for s in swept.sweep], [0.5, -2.0])
        for s in swept.sweep:
            by_hand = [(strongest, "set", s.value, [3]), steering[1]]
            losses, last = run(prompt, by_hand)
            numpy.testing.assert_allclose(s.run.token_losses, losses.numpy(), atol=1e-4)
            kl = float((clean_lp.exp() * (clean_lp - last)).sum())
            self.assertAlmostEqual(s.kl_divergence, kl, delta=1e-4 * kl + 1e-6)
            self.assertEqual(s.run.next[0].token_id, int(last.argmax()))

        # latentctl shows the same runs.
        shown = daemon.latentctl("steer", str(dataset), *map(str, prompt),
                                 "--intervene=%d:set=0@3,%d:add=4" % (strongest, steer_along),
                                 "--new_tokens=5", "--limit=5").stdout
        self.assertIn("latent %d set 0 (position 3)" % strongest, shown)
        self.assertIn("latent %d add 4 (every position)" % steer_along, shown)
        self.assertIn("continuation (5 tokens, greedy):", shown)
        self.assertIn("steered: " + " ".join(map(str, got.steered.generated)), shown)
        self.assertIn("KL(clean || steered) %.4g nats" % got.kl_divergence, shown)
        shown = daemon.latentctl("steer", str(dataset), *map(str, prompt),
                                 "--intervene=%d:set=0@3,%d:add=4" % (strongest, steer_along),
                                 "--new_tokens=3", "--sweep=0.5,-2").stdout
        self.assertIn("sweep of latent %d set:" % strongest, shown)
        page = os.path.join(self.tmp, "steering.html")
        daemon.latentctl("steer", str(dataset), *map(str, prompt),
                         "--intervene=%d:set=0@3,%d:add=4" % (strongest, steer_along),
                         "--new_tokens=3", "--sweep=0.5,-2", "--html=" + page)
        with open(page) as f:
            html = f.read()
        self.assertIn("<title>value -2: KL %.4g nats</title>" % swept.sweep[1].kl_divergence, html)
        self.assertIn("mean loss clean %.4f, steered %.4f" % (got.clean.mean_loss,
                                                              got.steered.mean_loss), html)
        sweep_lines = shown.split("sweep of latent")[1].splitlines()[2:4]
        self.assertEqual([line.split()[0] for line in sweep_lines], ["0.5", "-2"])
        self.assertEqual(sweep_lines[1].split()[-3:],
                         [str(t) for t in swept.sweep[1].run.generated])

        # Attribution: the metric's gradient at the hook by python3-torch's autograd, each
        # firing latent credited z * (W_dec[j] . g), the error term (x - x_hat) . g.
        target = int(clean_lp.argmax())
        contrast = (target + 1) % VOCAB
        for contrasted in (False, True):
            zero = torch.zeros(1, len(prompt), D, requires_grad=True)
            seen = {}

            def add_zero(x):
                seen["x"] = x.detach()
                return x + zero
            final = gpt2(torch.tensor([prompt]), {HOOK: add_zero})["final"]
            logits = (gpt2.layer_norm("ln_f", final)[0] @ weights["wte.weight"].T)[-1]
            metric = (logits[target] - logits[contrast] if contrasted
                      else logits.double().log_softmax(-1)[target])
            metric.backward()
            g = zero.grad[0]
            with torch.no_grad():
                x = seen["x"][0]
                codes = encode(sae, x)
                x_hat = codes @ sae["W_dec"] + sae["b_dec"]
                credit = codes * (g @ sae["W_dec"].T)  # [positions, latents]
            got = c.attribute_prompt(dataset, prompt, target_token_id=target,
                                     contrast_token_id=contrast if contrasted else None, top=10)
            self.assertEqual(got.target_token_id, target)
            self.assertEqual(got.HasField("contrast_token_id"), contrasted)
            self.assertAlmostEqual(got.metric, float(metric), places=4)
            numpy.testing.assert_allclose(got.error_attribution,
                                          float(((x - x_hat) * g).sum()), rtol=1e-3, atol=1e-5)
            numpy.testing.assert_allclose(got.latent_attribution, float(credit.sum()),
                                          rtol=1e-3, atol=1e-5)
            numpy.testing.assert_allclose(got.latent_attribution_by_position,
                                          credit.sum(1).numpy(), rtol=1e-3, atol=1e-5)
            order = credit.flatten().abs().argsort(descending=True)[:10]
            want = [(int(i) // D_SAE, int(i) % D_SAE) for i in order]
            self.assertEqual([(e.position, e.latent) for e in got.top_entries], want)
            numpy.testing.assert_allclose([e.attribution for e in got.top_entries],
                                          credit.flatten()[order].numpy(), rtol=1e-3, atol=1e-5)
            per_latent = credit.sum(0)
            self.assertEqual([l.latent for l in got.top_latents],
                             per_latent.abs().argsort(descending=True)[:10].tolist())
        # Ablating the entry credited most moves the metric by about minus its credit (first
        # order): SteerPrompt's clean and steered next-token log-probabilities tell.
        first = got.top_entries[0]
        ablated = c.steer_prompt(dataset, prompt, [(first.latent, "set", 0.0, [first.position])],
                                 top_tokens=VOCAB)

        def logit_gap(run):  # log p(target) - log p(contrast) = the logit difference
            p = {t.token_id: t.probability for t in run.next}
            return numpy.log(p[target]) - numpy.log(p[contrast])
        moved = logit_gap(ablated.steered) - logit_gap(ablated.clean)
        self.assertLess(abs(moved + first.attribution), 0.5 * abs(first.attribution) + 1e-3)
        # The ablation check measures the same in the daemon, for each of the top 3 entries: the
        # logit difference with z_j[p] W_dec[j] taken out at p, by hand.
        checked = c.attribute_prompt(dataset, prompt, target_token_id=target,
                                     contrast_token_id=contrast, top=4, ablate=3)
        self.assertAlmostEqual(checked.top_entries[0].ablated_change, moved, places=4)
        self.assertFalse(checked.top_entries[3].HasField("ablated_change"))

        def gap_without(position, change):
            def take_out(x):
                x = x.clone()
                x[0, position] -= change
                return x
            with torch.no_grad():
                final = gpt2(torch.tensor([prompt]), {HOOK: take_out})["final"]
                logits = (gpt2.layer_norm("ln_f", final)[0] @ weights["wte.weight"].T)[-1]
            return float(logits[target] - logits[contrast])
        clean_gap = gap_without(0, torch.zeros(D))
        for e in checked.top_entries[:3]:
            by_hand = gap_without(e.position, e.activation * sae["W_dec"][e.latent]) - clean_gap
            self.assertAlmostEqual(e.ablated_change, by_hand, places=4)
        shown = daemon.latentctl("attribute", str(dataset), *map(str, prompt),
                                 "--target=%d" % target, "--contrast=%d" % contrast, "--limit=4",
                                 "--ablate=3").stdout
        self.assertIn("ablation check of the top 3 entries", shown)
        drawn_check = c.show_attribution(dataset, prompt, target_token_id=target,
                                         contrast_token_id=contrast, ablate=3)._repr_html_()
        self.assertIn("ablation check of the top 3 entries", drawn_check)
        self.assertEqual(drawn_check.count("<circle"), 3)
        shown = daemon.latentctl("attribute", str(dataset), *map(str, prompt),
                                 "--target=%d" % target, "--limit=3").stdout
        page = os.path.join(self.tmp, "attribution.html")
        daemon.latentctl("attribute", str(dataset), *map(str, prompt), "--target=%d" % target,
                         "--limit=3", "--html=" + page)
        with open(page) as f:
            self.assertIn("what drives log p(<code>", f.read())
        plain = c.attribute_prompt(dataset, prompt, target_token_id=target, top=3)
        self.assertIn("metric log p(%d) = %.4f" % (target, plain.metric), shown)
        self.assertIn("  %-8d %-+12.4f" % (plain.top_latents[0].latent,
                                           plain.top_latents[0].attribution), shown)
        # The same prediction at the suite's other hook: a line per dataset.
        suite = daemon.latentctl("attribute", str(dataset), *map(str, prompt),
                                 "--target=%d" % target, "--limit=2", "--all_hooks").stdout
        other = c.attribute_prompt(dataset, prompt, target_token_id=target, top=2)
        at_layer0 = c.attribute_prompt(layer0, prompt, target_token_id=target, top=2)
        line = suite.split("the same metric at the other hooks:\n")[1].splitlines()[0]
        self.assertIn("latents %+.4f, error %+.4f; top %d %+.3g" % (
            at_layer0.latent_attribution, at_layer0.error_attribution,
            at_layer0.top_latents[0].latent, at_layer0.top_latents[0].attribution), line)
        self.assertNotEqual(at_layer0.latent_attribution, other.latent_attribution)

        # Latent to latent: which latents of block 0's SAE drive a latent of block 1's at
        # position 4; autograd's gradient of that latent's value at block 0's hook.
        layer0_hook = "blocks.0.hook_resid_post"
        zero = torch.zeros(1, len(prompt), D, requires_grad=True)
        seen = {}

        def add_at_layer0(x):
            seen["x"] = x.detach()
            return x + zero
        later = gpt2(torch.tensor([prompt]), {layer0_hook: add_at_layer0})[HOOK]
        z_later = encode(sae, later)[0]
        target_latent = int(z_later[4].argmax())
        z_later[4, target_latent].backward()
        with torch.no_grad():
            credit = encode(sae, seen["x"][0]) * (zero.grad[0] @ sae["W_dec"].T)
        driven = c.attribute_prompt(layer0, prompt, top=10,
                                    target_latent=(dataset, target_latent, 4))
        self.assertAlmostEqual(driven.metric, float(z_later[4, target_latent]), places=4)
        self.assertEqual(driven.target_latent.latent, target_latent)
        numpy.testing.assert_allclose(driven.latent_attribution_by_position,
                                      credit.sum(1).numpy(), rtol=1e-3, atol=1e-5)
        order = credit.flatten().abs().argsort(descending=True)[:10]
        self.assertEqual([(e.position, e.latent) for e in driven.top_entries],
                         [(int(i) // D_SAE, int(i) % D_SAE) for i in order])
        shown = daemon.latentctl("attribute", str(layer0), *map(str, prompt),
                                 "--target_latent=%d:%d@4" % (dataset, target_latent),
                                 "--limit=3", "--all_hooks").stdout
        self.assertIn("metric latent %d of dataset %d at position 4 (%d) = %.4f" % (
            target_latent, dataset, prompt[4], driven.metric), shown)
        # Steering a circuit across hooks: block 0's SAE's latent set to 0 at a position in the
        # same run as block 1's steering, block 1 encoding what block 0's change left; by hand
        # with both splices. The same through latentctl.
        z0 = encode(sae, seen["x"][0])
        early = int(z0[2].argmax())
        across = c.steer_prompt(dataset, prompt, steering, top_tokens=5,
                                more={layer0: [(early, "set", 0.0, [2])]})

        def splice_layer0(x):
            z = encode(sae, x)
            changed = z.clone()
            changed[0, 2, early] = 0.0
            return x + (changed - z) @ sae["W_dec"]
        with torch.no_grad():
            final = gpt2(torch.tensor([prompt]), {layer0_hook: splice_layer0,
                                                  HOOK: splice(steering)})["final"]
            logits = gpt2.layer_norm("ln_f", final)[0] @ weights["wte.weight"].T
        losses = -logits.log_softmax(-1)[:-1].gather(
            1, torch.tensor(prompt[1:]).unsqueeze(1)).squeeze(1)
        numpy.testing.assert_allclose(across.steered.token_losses, losses.numpy(), atol=1e-4)
        alone = c.steer_prompt(dataset, prompt, steering, top_tokens=5)
        self.assertGreater(numpy.abs(numpy.subtract(across.steered.token_losses,
                                                    alone.steered.token_losses)).max(), 1e-4)
        shown = daemon.latentctl("steer", str(dataset), *map(str, prompt), "--new_tokens=0",
                                 "--intervene=%d:add=4" % steer_along,
                                 "--more_interventions=%d=%d:set=0@2" % (layer0, early)).stdout
        # (The flag reaches the daemon: the KL is the one with block 0's change, not without.)
        with_more = c.steer_prompt(dataset, prompt, [(steer_along, "add", 4.0)],
                                   more={layer0: [(early, "set", 0.0, [2])]})
        without = c.steer_prompt(dataset, prompt, [(steer_along, "add", 4.0)])
        self.assertNotEqual("%.4g" % with_more.kl_divergence, "%.4g" % without.kl_divergence)
        self.assertIn("KL(clean || steered) %.4g nats" % with_more.kl_divergence, shown)
        with self.assertRaises(grpc.RpcError) as missing:
            c.steer_prompt(dataset, prompt, steering, more={dataset + 99: [(0, "add", 1.0)]})
        self.assertEqual(missing.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("more_interventions[0]", missing.exception.details())

        # The attribution graph over the suite: block 1's nodes are the prediction's strongest
        # entries; block 0's drive them.
        page = os.path.join(self.tmp, "graph.html")
        graph = daemon.latentctl("graph", str(dataset), *map(str, prompt), "--target=%d" % target,
                                 "--per_hook=2", "--html=" + page, "--node_pages").stdout
        strongest_entry = c.attribute_prompt(dataset, prompt, target_token_id=target,
                                             top=20).top_entries[0]
        block1 = graph.split("%s (dataset %d):\n" % (HOOK, dataset))[1].splitlines()
        # First what the hook's kept nodes cover, then each node with its label: the tokens its
        # latent fires on most over the dataset.
        self.assertRegex(block1[0], r"^  \(2 kept nodes: \d+% of what reaches the hook; SAE "
                                    r"error \d+%, not kept \d+%\)$")
        self.assertIn("#%d @%d" % (strongest_entry.latent, strongest_entry.position), block1[1])
        self.assertIn("-> output %+.3g" % strongest_entry.attribution, block1[1])
        most = c.get_latent(dataset, strongest_entry.latent, top_tokens=3).top_tokens
        self.assertEqual(block1[2], "      fires most on " + ", ".join(
            "%d %.0f%%" % (t.token_id, 100 * t.fraction) for t in most))
        self.assertIn("blocks.0.hook_resid_post (dataset %d):" % layer0, graph)
        with open(page) as f:
            drawn_page = f.read()
        self.assertIn("<title>output &#183; importance 1.000</title>", drawn_page)
        # --node_pages: each latent node links to its page beside the graph's, which links back.
        node_page = "graph-pages/%d/latent-%d.html" % (dataset, strongest_entry.latent)
        self.assertIn('<a href="%s"><g>' % node_page, drawn_page)
        with open(os.path.join(self.tmp, node_page)) as f:
            self.assertIn('<a href="../../graph.html">back to the attribution graph</a>', f.read())
        # The same graph in Python: the output's parents are the strongest entries, each with
        # its credit as the edge to the output; the notebook view draws it.
        heard = []
        drawn = c.attribution_graph([layer0, dataset], prompt, target_token_id=target,
                                    per_hook=2, progress=heard.append)
        self.assertEqual([(p.hooks_done, p.hooks) for p in heard], [(1, 2), (2, 2)])
        self.assertEqual(heard[-1].passes, 3)  # the metric's, then one per kept node
        self.assertEqual([h.dataset_id for h in drawn.hooks], [layer0, dataset])
        to_output = [(drawn.nodes[e.from_node], e.attribution) for e in drawn.edges
                     if e.to_node == 0 and drawn.nodes[e.from_node].latent >= 0]
        self.assertEqual((to_output[0][0].latent, to_output[0][0].position),
                         (strongest_entry.latent, strongest_entry.position))
        self.assertAlmostEqual(to_output[0][1], strongest_entry.attribution, places=5)
        self.assertTrue(any(n.hook == 0 for n in drawn.nodes))  # block 0's latents drive them
        # Where the output goes: all of it reaches block 1 (kept, error, not kept); block 0
        # explains what block 1's kept nodes carry.
        last, first = drawn.hooks[1], drawn.hooks[0]
        self.assertEqual(last.kept_nodes, 2)
        self.assertAlmostEqual(last.kept_importance + last.error_importance
                               + last.dropped_importance, 1.0, places=9)
        self.assertAlmostEqual(first.kept_importance + first.error_importance
                               + first.dropped_importance, last.kept_importance, places=9)
        kept = sum(n.importance for n in drawn.nodes if n.hook == 1 and n.latent >= 0)
        self.assertAlmostEqual(last.kept_importance, kept, places=9)
        # With the ablation check each edge from a child's 2 strongest parents carries the
        # change AttributePrompt's check measures: of the metric for the output's parents, of
        # the child latent's value for block 0's.
        checked_graph = c.attribution_graph([layer0, dataset], prompt, target_token_id=target,
                                            per_hook=2, ablate=True)
        nodes = checked_graph.nodes
        by_child = {}  # child node -> {(latent, position): measured change}
        for e in checked_graph.edges:
            if e.HasField("ablated_change"):
                parent = nodes[e.from_node]
                by_child.setdefault(e.to_node, {})[(parent.latent, parent.position)] = \
                    e.ablated_change
        self.assertIn(0, by_child)
        self.assertGreater(len(by_child), 1)  # block 1's nodes were checked too
        for child, measured in by_child.items():
            if child == 0:
                answer = c.attribute_prompt(dataset, prompt, target_token_id=target, top=20,
                                            ablate=2)
            else:
                answer = c.attribute_prompt(layer0, prompt, top=20, ablate=2, target_latent=(
                    dataset, nodes[child].latent, nodes[child].position))
            want = {(e.latent, e.position): e.ablated_change for e in answer.top_entries[:2]}
            for key, change in measured.items():
                self.assertAlmostEqual(change, want[key], places=5)
        checked_view = c.show_attribution_graph([layer0, dataset], prompt,
                                                target_token_id=target, per_hook=2,
                                                ablate=True)._repr_html_()
        self.assertEqual(checked_view.count("taken out, it moves by"),
                         sum(len(m) for m in by_child.values()))
        self.assertIn("ablation check of %d edges" % sum(len(m) for m in by_child.values()),
                      checked_view)
        # And the graph's latents at both hooks taken out of one run together: by hand, block
        # 1's SAE encoding what block 0's removals left.
        kept = [n for n in nodes[1:] if n.latent >= 0]
        self.assertEqual(checked_graph.circuit_latents, len(kept))

        def take_out(hook_index):
            def f(x):
                x = x.clone()
                codes = encode(sae, x[0])
                for n in kept:
                    if n.hook == hook_index:
                        x[0, n.position] -= codes[n.position, n.latent] * sae["W_dec"][n.latent]
                return x
            return f
        with torch.no_grad():
            final = gpt2(torch.tensor([prompt]), {layer0_hook: take_out(0),
                                                  HOOK: take_out(1)})["final"]
            logits = (gpt2.layer_norm("ln_f", final)[0] @ weights["wte.weight"].T)[-1]
        without = float(logits.double().log_softmax(-1)[target])
        self.assertAlmostEqual(checked_graph.circuit_ablated_change,
                               without - checked_graph.output.metric, places=4)
        self.assertIn("the graph's %d latents taken out together" % len(kept), checked_view)
        checked_text = daemon.latentctl("graph", str(dataset), *map(str, prompt),
                                        "--target=%d" % target, "--per_hook=2",
                                        "--node_tokens=0", "--ablate=1").stdout
        self.assertIn("ablation check of %d edges" % sum(len(m) for m in by_child.values()),
                      checked_text)
        self.assertIn("the graph's %d latents taken out together move the metric by %+.4g"
                      % (len(kept), checked_graph.circuit_ablated_change), checked_text)
        # A node threshold below the strongest node's share of the latents keeps it alone.
        lone = c.attribution_graph([layer0, dataset], prompt, target_token_id=target,
                                   per_hook=2, node_threshold=1e-6)
        self.assertEqual(lone.hooks[1].kept_nodes, 1)
        self.assertEqual([n.latent for n in lone.nodes if n.hook == 1 and n.latent >= 0],
                         [to_output[0][0].latent])
        view = c.show_attribution_graph([dataset, layer0], prompt, target_token_id=target,
                                        per_hook=2)._repr_html_()
        self.assertIn("<svg", view)
        self.assertEqual(view.count("<rect"), len(drawn.nodes))
        self.assertIn("fires most on %d %.0f%%" % (most[0].token_id, 100 * most[0].fraction),
                      view)
        self.assertIn(">kept %.0f%% &#183; error" % (100 * last.kept_importance), view)
        with self.assertRaises(grpc.RpcError) as backwards:  # block 1 comes after block 0
            c.attribute_prompt(dataset, prompt, target_latent=(layer0, 0, 4))
        self.assertIn("target_latent.dataset_id", backwards.exception.details())

        # The notebook views.
        shown = c.show_attribution(dataset, prompt, target_token_id=target, top=2)._repr_html_()
        self.assertIn("metric %.4f for token %d" % (plain.metric, target), shown)
        self.assertIn(">latent %d " % plain.top_latents[0].latent, shown)
        self.assertEqual(shown.count("latent "), 2)
        steered_view = c.show_steering(dataset, prompt, steering, new_tokens=3,
                                       sweep=[0.5])._repr_html_()
        self.assertIn("<td>sweep 0.5</td>", steered_view)
        self.assertIn("<title>value 0.5: KL", steered_view)  # the sweep's KL plotted
        again = c.steer_prompt(dataset, prompt, steering, new_tokens=3, sweep=[0.5])
        self.assertIn("loss %+.4f steered" % (again.steered.token_losses[0]
                                              - again.clean.token_losses[0]), steered_view)
        self.assertIn("<td>steered</td><td>%.4g</td>" % got_kl, steered_view)
        with self.assertRaises(grpc.RpcError) as bad_target:
            c.attribute_prompt(dataset, prompt, target_token_id=VOCAB)
        self.assertIn("target_token_id: %d outside the vocabulary" % VOCAB,
                      bad_target.exception.details())

        # Bad input names the field.
        with self.assertRaises(grpc.RpcError) as bad:
            c.steer_prompt(dataset, prompt, [(D_SAE, "set", 0.0)])
        self.assertEqual(bad.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("interventions[0].latent", bad.exception.details())
        with self.assertRaises(grpc.RpcError) as long:  # past the 32 positions GPT-2 has
            c.steer_prompt(dataset, prompt, [(1, "add", 1.0)], new_tokens=POSITIONS - 6)
        self.assertIn("new_tokens: 26 after a prompt of 7 tokens pass the model's context of 32",
                      long.exception.details())
        with self.assertRaises(ValueError):
            c.steer_prompt(dataset, prompt, [(1, "clamp", 1.0)])
        usage = daemon.latentctl("steer", str(dataset), "1", "--intervene=1:mul=2", check=False)
        self.assertEqual(usage.returncode, 2)
        self.assertIn("--intervene: '1:mul=2'", usage.stderr)

    def test_a_cross_layer_transcoders_latent_writes_every_later_layer(self):
        # A ReLU cross-layer transcoder in circuit-tracer's release layout, reading each block's
        # hook_resid_mid and writing hook_mlp_out of its block and every later one. Steering a
        # latent of layer 1 changes the MLP outputs of blocks 1 and 2 through its decoder into
        # each, and attribution credits it through both: checked against GPT-2 in python3-torch.
        weights, cfg = random_gpt2_weights(seed=4), gpt2_config()
        model_dir = os.path.join(self.tmp, "gpt2")
        write_hf_checkpoint(model_dir, cfg, weights)
        release = os.path.join(self.tmp, "clt")
        os.makedirs(release)
        with open(os.path.join(release, "config.yaml"), "w") as f:
            f.write("model_kind: cross_layer_transcoder\nfeature_input_hook: hook_resid_mid\n"
                    "feature_output_hook: hook_mlp_out\nactivation: relu\n")
        g = torch.Generator().manual_seed(6)
        clt = []
        for layer in range(LAYERS):
            w_enc = torch.randn(D_SAE, D, generator=g)
            w = {"W_enc_%d" % layer: w_enc / w_enc.norm(dim=1, keepdim=True) * 3,
                 "b_enc_%d" % layer: torch.randn(D_SAE, generator=g) * 0.1 - 0.3,
                 "b_dec_%d" % layer: torch.randn(D, generator=g) * 0.05}
            write_safetensors(os.path.join(release, "W_enc_%d.safetensors" % layer), w)
            w_dec = torch.randn(D_SAE, LAYERS - layer, D, generator=g) * 0.1
            write_safetensors(os.path.join(release, "W_dec_%d.safetensors" % layer),
                              {"W_dec_%d" % layer: w_dec})
            clt.append((w["W_enc_%d" % layer], w["b_enc_%d" % layer], w["b_dec_%d" % layer], w_dec))
        ids = numpy.random.default_rng(7).integers(0, VOCAB, size=4 * CTX).astype(numpy.uint16)
        numpy.save(os.path.join(self.tmp, "tokens.npy"), ids)
        daemon = self.start_daemon(devices="cpu:1", extra_args=["--data_roots=" + self.tmp])
        c = daemon.client()
        job = c.wait(c.submit("EXTRACT", {
            "model": {"huggingface": {"path": model_dir}}, "hookName": "blocks.1.hook_resid_mid",
            "tokens": {"path": os.path.join(self.tmp, "tokens.npy"), "contextLength": CTX},
            "sae": {"path": release}, "mode": "SPARSE"}).id)
        self.assertEqual(job.state, jobs_pb2.SUCCEEDED, job.message)
        dataset = job.result.extract.dataset_id
        w_enc, b_enc, b_dec, w_dec = clt[1]
        writes = {"blocks.1.hook_mlp_out": w_dec[:, 0], "blocks.2.hook_mlp_out": w_dec[:, 1]}

        def encode(x):
            return (x @ w_enc.T + b_enc).relu()

        gpt2 = Gpt2(weights, cfg)
        prompt = [int(t) for t in ids[:7]]
        with torch.no_grad():
            z = encode(gpt2(torch.tensor([prompt]))["blocks.1.hook_resid_mid"])[0]
        strongest = int(z[3].argmax())
        self.assertGreater(float(z[3, strongest]), 0)
        steering = [(strongest, "set", 0.0, [3]), ((strongest + 1) % D_SAE, "add", 4.0)]

        def run(tokens, steered):
            """Per-position losses and the last position's log-probabilities, with z' - z of
            the steering added at both hooks the latents write when `steered`."""
            change = {}

            def read(x):
                codes = encode(x)
                changed = codes.clone()
                for latent, mode, value, *positions in steering:
                    where = positions[0] if positions else slice(None)
                    changed[0, where, latent] = {"set": value, "add": codes[0, where, latent] +
                                                 value}[mode]
                change["dz"] = changed - codes
                return x

            splice = {"blocks.1.hook_resid_mid": read}
            for hook, rows in writes.items():
                splice[hook] = lambda y, rows=rows: y + change["dz"] @ rows
            with torch.no_grad():
                final = gpt2(torch.tensor([tokens]), splice if steered else None)["final"]
                logits = gpt2.layer_norm("ln_f", final)[0] @ weights["wte.weight"].T
            log_probs = logits.log_softmax(-1)
            losses = -log_probs[:-1].gather(1, torch.tensor(tokens[1:]).unsqueeze(1)).squeeze(1)
            return losses, log_probs[-1]

        got = c.steer_prompt(dataset, prompt, steering, new_tokens=3, top_tokens=5)
        for name, answer, steered in (("clean", got.clean, False), ("steered", got.steered, True)):
            losses, last = run(prompt, steered)
            numpy.testing.assert_allclose(answer.token_losses, losses.numpy(), atol=1e-4,
                                          err_msg=name)
            self.assertEqual([t.token_id for t in answer.next], last.topk(5).indices.tolist())
            tokens = list(prompt)
            for _ in range(3):
                tokens.append(int(run(tokens, steered)[1].argmax()))
            self.assertEqual(list(answer.generated), tokens[len(prompt):], name)
        clean_lp, steered_lp = run(prompt, False)[1], run(prompt, True)[1]
        kl = float((clean_lp.exp() * (clean_lp - steered_lp)).sum())
        self.assertGreater(kl, 1e-4)
        self.assertAlmostEqual(got.kl_divergence, kl, delta=1e-4 * kl + 1e-6)

        # Attribution: autograd's gradients at both written hooks, each entry credited
        # z * (W_dec_1[j, 0] . g_1 + W_dec_1[j, 1] . g_2); the error term block 1's.
        target = int(clean_lp.argmax())
        zeros = {hook: torch.zeros(1, len(prompt), D, requires_grad=True) for hook in writes}
        seen = {}

        def keep(name):
            def f(x):
                seen[name] = x.detach()
                return x + zeros[name] if name in zeros else x
            return f
        hooks = ["blocks.1.hook_resid_mid"] + list(writes)
        final = gpt2(torch.tensor([prompt]), {h: keep(h) for h in hooks})["final"]
        logits = (gpt2.layer_norm("ln_f", final)[0] @ weights["wte.weight"].T)[-1]
        logits.double().log_softmax(-1)[target].backward()
        with torch.no_grad():
            codes = encode(seen["blocks.1.hook_resid_mid"][0])
            credit = codes * sum(zeros[h].grad[0] @ rows.T for h, rows in writes.items())
            error = seen["blocks.1.hook_mlp_out"][0] - (codes @ w_dec[:, 0] + b_dec)
        got = c.attribute_prompt(dataset, prompt, target_token_id=target, top=10)
        numpy.testing.assert_allclose(got.latent_attribution, float(credit.sum()), rtol=1e-3,
                                      atol=1e-5)
        numpy.testing.assert_allclose(got.latent_attribution_by_position, credit.sum(1).numpy(),
                                      rtol=1e-3, atol=1e-5)
        numpy.testing.assert_allclose(
            got.error_attribution,
            float((error * zeros["blocks.1.hook_mlp_out"].grad[0]).sum()), rtol=1e-3, atol=1e-5)
        order = credit.flatten().abs().argsort(descending=True)[:10]
        self.assertEqual([(e.position, e.latent) for e in got.top_entries],
                         [(int(i) // D_SAE, int(i) % D_SAE) for i in order])


if __name__ == "__main__":
    unittest.main()
