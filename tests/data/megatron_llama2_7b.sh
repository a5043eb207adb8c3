#!/bin/bash
# A Megatron-LM launch as its examples write them (examples/gpt3/train_gpt3_175b_distributed.sh's shape)
torchrun --nproc_per_node 8 --nnodes 2 --node_rank $NODE_RANK --master_addr $MASTER_ADDR pretrain_gpt.py \
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 11008 \
    --seq-length 4096 --max-position-embeddings 4096 \
    --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear \
    --untie-embeddings-and-output-weights --tokenizer-type NullTokenizer --vocab-size 32000 \
    --micro-batch-size 1 --global-batch-size 128 --train-iters 500 \
    --tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 1 \
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --bf16 --lr 3e-4 --log-interval 10 --log-throughput --mock-data
