"""Third-party models for the estimator's accuracy benchmark and tests: nothing written here.

Each ``make_*`` function returns a :class:`memfit.estimate.TorchStep` whose model comes from a
library as a user would take it (no weights are downloaded: models are built from their
config classes, policies from small gymnasium environments defined here):

* transformers: GPT-2 (causal LM), BERT (masked LM), ViT (image classification; its
  ``trunc_normal_`` initialiser reads tensor values), T5 (sequence to sequence), each with
  AdamW and the loss the model computes itself;
* stable-baselines3: the DQN ``CnnPolicy`` (Nature CNN on 84x84x4 frames), the PPO
  ``MlpPolicy`` and the PPO ``MultiInputPolicy`` (image + vector observations). Every SB3
  policy calls ``module.to(device)`` in its constructor. The steps are one gradient step of
  SB3's own ``DQN.train`` / ``PPO.train`` (the same lines, on one batch), logging included:
  SB3 reads each loss with ``.item()``, which the step wraps in
  :func:`memfit.estimate.stand_in_scalars`, as a user would when the call sits in a library.

``THIRD_PARTY_WORKLOADS`` maps a name to ``(factory, batch sizes)`` as
``accuracy_workloads.TORCH_WORKLOADS`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memfit.estimate import TorchStep, stand_in_scalars

__all__ = ["SMALL_THIRD_PARTY", "THIRD_PARTY_WORKLOADS"]


def _torch() -> Any:
    import torch

    return torch


# --- transformers ---------------------------------------------------------------------------


def _lm_step(model: Any, opt: Any, batch: Any) -> None:
    """One training step of a Hugging Face model that computes its own loss from ``labels``."""
    out = model(**batch)
    opt.zero_grad(set_to_none=True)
    out.loss.backward()
    opt.step()


def _hf(build_model: Callable[[], Any], make_batch: Callable[[int], Any]) -> TorchStep:
    torch = _torch()

    def build() -> tuple[Any, Any]:
        model = build_model()
        model.train()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4)

    return TorchStep(build, _lm_step, make_batch)


def make_gpt2(layers: int = 4, dim: int = 256, seq: int = 128, vocab: int = 8192) -> TorchStep:
    """transformers ``GPT2LMHeadModel`` (causal LM loss on its own input), AdamW."""
    import transformers

    torch = _torch()
    config = transformers.GPT2Config(
        n_layer=layers,
        n_embd=dim,
        n_head=max(1, dim // 64),
        vocab_size=vocab,
        n_positions=seq,
        bos_token_id=0,
        eos_token_id=0,
    )

    def make_batch(b: int) -> Any:
        ids = torch.randint(0, vocab, (b, seq))
        return {"input_ids": ids, "labels": ids}

    return _hf(lambda: transformers.GPT2LMHeadModel(config), make_batch)


def make_bert(layers: int = 4, dim: int = 256, seq: int = 128, vocab: int = 8192) -> TorchStep:
    """transformers ``BertForMaskedLM`` (masked-LM loss), AdamW."""
    import transformers

    torch = _torch()
    config = transformers.BertConfig(
        num_hidden_layers=layers,
        hidden_size=dim,
        num_attention_heads=max(1, dim // 64),
        intermediate_size=4 * dim,
        vocab_size=vocab,
        max_position_embeddings=seq,
    )

    def make_batch(b: int) -> Any:
        ids = torch.randint(0, vocab, (b, seq))
        return {"input_ids": ids, "attention_mask": torch.ones(b, seq), "labels": ids}

    return _hf(lambda: transformers.BertForMaskedLM(config), make_batch)


def make_vit(image: int = 96, patch: int = 8, layers: int = 4, dim: int = 256) -> TorchStep:
    """transformers ``ViTForImageClassification`` (initialised with ``trunc_normal_``), AdamW."""
    import transformers

    torch = _torch()
    config = transformers.ViTConfig(
        image_size=image,
        patch_size=patch,
        hidden_size=dim,
        num_hidden_layers=layers,
        num_attention_heads=max(1, dim // 64),
        intermediate_size=4 * dim,
        num_labels=100,
    )

    def make_batch(b: int) -> Any:
        return {
            "pixel_values": torch.randn(b, 3, image, image),
            "labels": torch.randint(0, 100, (b,)),
        }

    return _hf(lambda: transformers.ViTForImageClassification(config), make_batch)


def make_t5(layers: int = 3, dim: int = 256, seq: int = 128, vocab: int = 8192) -> TorchStep:
    """transformers ``T5ForConditionalGeneration`` (encoder-decoder, target half as long), AdamW."""
    import transformers

    torch = _torch()
    config = transformers.T5Config(
        num_layers=layers,
        num_decoder_layers=layers,
        d_model=dim,
        d_kv=64,
        num_heads=max(1, dim // 64),
        d_ff=4 * dim,
        vocab_size=vocab,
        decoder_start_token_id=0,
        pad_token_id=0,
    )

    def make_batch(b: int) -> Any:
        return {
            "input_ids": torch.randint(1, vocab, (b, seq)),
            "labels": torch.randint(1, vocab, (b, seq // 2)),
        }

    return _hf(lambda: transformers.T5ForConditionalGeneration(config), make_batch)


# --- stable-baselines3 ------------------------------------------------------------------------


def _sampling_env(observation_space: Any, action_space: Any) -> Any:
    """An environment whose every observation is a sample of ``observation_space`` (reward 0,
    never done)."""
    import gymnasium as gym

    class Sampling(gym.Env):  # type: ignore[misc]
        def __init__(self) -> None:
            self.observation_space = observation_space
            self.action_space = action_space

        def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
            super().reset(seed=seed)
            return self.observation_space.sample(), {}

        def step(self, action: Any) -> Any:
            return self.observation_space.sample(), 0.0, False, False, {}

    return Sampling()


def _frames_env(image: int = 84, stack: int = 4, actions: int = 6) -> Any:
    """An Atari-like environment: ``image`` x ``image`` x ``stack`` uint8 frames."""
    import gymnasium as gym
    import numpy as np

    return _sampling_env(
        gym.spaces.Box(0, 255, (image, image, stack), np.uint8), gym.spaces.Discrete(actions)
    )


def _vector_env(obs_dim: int = 64, act_dim: int = 8) -> Any:
    """A continuous-control environment: ``obs_dim`` floats in, ``act_dim`` floats out."""
    import gymnasium as gym
    import numpy as np

    return _sampling_env(
        gym.spaces.Box(-1.0, 1.0, (obs_dim,), np.float32),
        gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32),
    )


def _dict_env(image: int = 64, vector: int = 16, actions: int = 5) -> Any:
    """A multi-input environment: an RGB camera image and a state vector."""
    import gymnasium as gym
    import numpy as np

    return _sampling_env(
        gym.spaces.Dict(
            {
                "camera": gym.spaces.Box(0, 255, (image, image, 3), np.uint8),
                "state": gym.spaces.Box(-1.0, 1.0, (vector,), np.float32),
            }
        ),
        gym.spaces.Discrete(actions),
    )


def _sb3_build(
    algorithm: str, policy: str, make_env: Callable[[], Any], **kwargs: Any
) -> Callable[[], tuple[Any, Any]]:
    """A ``build`` that makes the stable-baselines3 agent (on a fresh ``make_env()``) and returns
    its policy, in training mode, and the policy's optimiser."""

    def build() -> tuple[Any, Any]:
        import stable_baselines3

        agent = getattr(stable_baselines3, algorithm)(policy, make_env(), device="auto", **kwargs)
        agent.policy.set_training_mode(True)
        return agent.policy, agent.policy.optimizer

    return build


def make_sb3_dqn_cnn(image: int = 84) -> TorchStep:
    """stable-baselines3 DQN ``CnnPolicy`` (online and target Nature CNN): one ``DQN.train``
    step."""
    torch = _torch()
    from torch.nn import functional as F

    build = _sb3_build(
        "DQN", "CnnPolicy", lambda: _frames_env(image), buffer_size=1, learning_starts=0
    )

    def make_batch(b: int) -> Any:
        # What ReplayBuffer.sample hands over: uint8 frames become floats in the policy.
        return (
            torch.randint(0, 256, (b, 4, image, image), dtype=torch.uint8),
            torch.randint(0, 6, (b, 1)),
            torch.randint(0, 256, (b, 4, image, image), dtype=torch.uint8),
            torch.zeros(b, 1),
            torch.randn(b, 1),
        )

    def step(policy: Any, opt: Any, batch: Any) -> None:
        obs, actions, next_obs, dones, rewards = batch
        with torch.no_grad():
            next_q = policy.q_net_target(next_obs).max(dim=1)[0].reshape(-1, 1)
            target_q = rewards + (1 - dones) * 0.99 * next_q
        current_q = torch.gather(policy.q_net(obs), dim=1, index=actions.long())
        loss = F.smooth_l1_loss(current_q, target_q)
        with stand_in_scalars():
            loss.item()  # SB3 logs every loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 10.0)
        opt.step()

    return TorchStep(build, step, make_batch)


def _ppo_step(policy: Any, opt: Any, batch: Any) -> None:
    """One minibatch of ``PPO.train`` (SB3 2.x), logging included."""
    torch = _torch()
    from torch.nn import functional as F

    obs, actions, _old_values, old_log_prob, advantages, returns = batch
    clip_range = 0.2
    values, log_prob, entropy = policy.evaluate_actions(obs, actions)
    values = values.flatten()
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    ratio = torch.exp(log_prob - old_log_prob)
    policy_loss_1 = advantages * ratio
    policy_loss_2 = advantages * torch.clamp(ratio, 1 - clip_range, 1 + clip_range)
    policy_loss = -torch.min(policy_loss_1, policy_loss_2).mean()
    value_loss = F.mse_loss(returns, values)
    entropy_loss = -torch.mean(entropy)
    with stand_in_scalars():  # SB3's logging reads each loss to the host
        policy_loss.item()
        torch.mean((torch.abs(ratio - 1) > clip_range).float()).item()
        value_loss.item()
        entropy_loss.item()
    loss = policy_loss + 0.0 * entropy_loss + 0.5 * value_loss
    with torch.no_grad(), stand_in_scalars():
        log_ratio = log_prob - old_log_prob
        torch.mean((torch.exp(log_ratio) - 1) - log_ratio).cpu().numpy()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
    opt.step()


def _ppo_batch(obs: Any, actions: Any, b: int) -> tuple[Any, ...]:
    """What PPO's rollout buffer hands ``PPO.train``: observations, actions, then old values,
    old log-probabilities, advantages and returns (``b`` floats each)."""
    torch = _torch()
    return (obs, actions, *(torch.randn(b) for _ in range(4)))


def make_sb3_ppo_mlp(obs_dim: int = 64, act_dim: int = 8) -> TorchStep:
    """stable-baselines3 PPO ``MlpPolicy`` (Gaussian actions), one ``PPO.train`` minibatch."""
    torch = _torch()
    build = _sb3_build("PPO", "MlpPolicy", lambda: _vector_env(obs_dim, act_dim), n_steps=64)

    def make_batch(b: int) -> Any:
        return _ppo_batch(torch.randn(b, obs_dim), torch.randn(b, act_dim), b)

    return TorchStep(build, _ppo_step, make_batch, batch_knob="minibatch_size")


def make_sb3_ppo_multi(image: int = 64, vector: int = 16) -> TorchStep:
    """stable-baselines3 PPO ``MultiInputPolicy`` (NatureCNN on the camera + the state vector)."""
    torch = _torch()
    build = _sb3_build("PPO", "MultiInputPolicy", lambda: _dict_env(image, vector), n_steps=64)

    def make_batch(b: int) -> Any:
        obs = {
            # SB3's buffers keep observations as float32 on the device
            "camera": torch.randint(0, 256, (b, 3, image, image)).float(),
            "state": torch.randn(b, vector),
        }
        return _ppo_batch(obs, torch.randint(0, 5, (b,)), b)

    return TorchStep(build, _ppo_step, make_batch, batch_knob="minibatch_size")


#: Name -> (factory, three batch sizes) for the accuracy benchmark.
THIRD_PARTY_WORKLOADS: dict[str, tuple[Callable[[], TorchStep], tuple[int, int, int]]] = {
    "hf_gpt2": (make_gpt2, (2, 8, 16)),
    "hf_bert": (make_bert, (2, 8, 16)),
    "hf_vit": (make_vit, (4, 16, 32)),
    "hf_t5": (make_t5, (2, 8, 16)),
    "sb3_dqn_cnn": (make_sb3_dqn_cnn, (32, 128, 256)),
    "sb3_ppo_mlp": (make_sb3_ppo_mlp, (64, 512, 4096)),
    "sb3_ppo_multi": (make_sb3_ppo_multi, (64, 256, 512)),
}

#: Small versions of each, for fast tests: name -> (factory, batch size).
SMALL_THIRD_PARTY: dict[str, tuple[Callable[[], TorchStep], int]] = {
    "hf_gpt2": (lambda: make_gpt2(layers=1, dim=64, seq=32, vocab=512), 2),
    "hf_bert": (lambda: make_bert(layers=1, dim=64, seq=32, vocab=512), 2),
    "hf_vit": (lambda: make_vit(image=32, patch=8, layers=1, dim=64), 2),
    "hf_t5": (lambda: make_t5(layers=1, dim=64, seq=32, vocab=512), 2),
    "sb3_dqn_cnn": (lambda: make_sb3_dqn_cnn(image=36), 4),
    "sb3_ppo_mlp": (lambda: make_sb3_ppo_mlp(obs_dim=8, act_dim=2), 16),
    "sb3_ppo_multi": (lambda: make_sb3_ppo_multi(image=36, vector=4), 4),
}
