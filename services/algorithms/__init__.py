"""RL math shared by the explorer and the trainer: the train-batch type, masked reductions, advantage fns.

Service-neutral and pure torch: no grpc, no model, no optimizer. The explorer runs some advantage
fns itself (multi_step_grpo's step-wise GRPO, services/explorer/pipeline/step_wise.py), so this
package must never import `services.trainer`; the trainer's losses, KL, entropy, sample strategies
and the composite algorithm live in services/trainer/algorithms and import from here.
"""
