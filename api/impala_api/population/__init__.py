"""The ImpalaPopulation kind: its manifest models (`spec`), the field paths a search and PBT name
(`paths`), the members a population draws (`members`) and PBT's decisions (`pbt`)."""
