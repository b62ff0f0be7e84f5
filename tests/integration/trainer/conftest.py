"""The live stack fixture (`harness.trainer_stack_url`) for this directory's tests."""

from tests.integration.trainer.harness import trainer_stack_url

__all__ = ["trainer_stack_url"]
