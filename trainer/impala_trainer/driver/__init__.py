"""The driver loop: the shared skeleton (`base`), the IMPALA and async-gradients modes, and the
actors it manages (`actor_manager`, `membership`) through the `backend` (Ray, or in process)."""
