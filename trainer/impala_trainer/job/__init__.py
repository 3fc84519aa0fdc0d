"""The job contract: the ImpalaJob model, reading manifests, and every role's command line.

Imports neither torch nor Ray (a test proves it): the operator, the CRD generator and
`impalajob validate` load only this and `rundir.snapshot`.
"""
