"""A user's own package, as a team brings one: an environment (`my_impala.envs`, registered when
imported) and a model (`my_impala.models`). manifests/examples/custom.yaml trains them; the
Dockerfile beside this package puts them into an image built FROM the product's."""
