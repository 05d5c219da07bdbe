"""SA-MoE (SAMOE.md): three matched mixture-of-experts architectures upcycled from one dense
GPT, and the routing ledger that audits the persistent routing state. One concept per
module; callers import the submodule they need.

``config``       frozen configs: the toy dense source, the MoE block, the continued-pretraining
                 recipe (SAMOE §4, §5, §7, §19.1), and the variant names.
``model``        the three architectures: ordinary, latest-write-only, persistent (§5, §9 sites).
``upcycle``      the step-0 MoE of a variant from a dense GPT and a seed, and its init
                 manifest (§6, §2).
``recipe``       LR groups, warmup + cosine schedule, weight decay, AdamW (§7).
``counts``       parameter counts, analytical FLOPs per token, trace sizes (§8).
``capture``      one clean forward's float32 record of every audit object (§9).
``ledger``       contributions c_{l→L}, reconstruction checks, history metrics, LWO's
                 structural attribution, state-only replay (§10).
``suppression``  full-forward source suppression (E7, §14.2–14.3) and the local attenuation
                 set-change rate (E5, §12).
``checks``       the SA-MoE acceptance checks K1–K15 (§20): one error format, one record.
``schedule``     the order the workflow starts ready jobs in: longest chain of work first.
"""
