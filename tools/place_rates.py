import numpy as np, onnx, onnxruntime as ort, time
from onnx import helper as h, TensorProto as T, numpy_helper as nh
def model(M,K,N,quant):
    rng=np.random.default_rng(0)
    W=rng.standard_normal((K,N)).astype(np.float32)
    inits=[]; nodes=[]
    if quant:
        s=np.abs(W).max(0)/63; wq=np.round(W/s).astype(np.int8)
        inits += [nh.from_array(wq,'wq'), nh.from_array(s.astype(np.float32),'ws'), nh.from_array(np.zeros(N,np.int8),'wz'),
                  nh.from_array(np.array(0.02,np.float32),'xs'), nh.from_array(np.array(128,np.uint8),'xz')]
        nodes += [h.make_node('QuantizeLinear',['x','xs','xz'],['xq']), h.make_node('DequantizeLinear',['xq','xs','xz'],['xd']),
                  h.make_node('DequantizeLinear',['wq','ws','wz'],['wd'],axis=1), h.make_node('MatMul',['xd','wd'],['y'])]
    else:
        inits += [nh.from_array(W,'w')]; nodes += [h.make_node('MatMul',['x','w'],['y'])]
    g=h.make_graph(nodes,'g',[h.make_tensor_value_info('x',T.FLOAT,[M,K])],[h.make_tensor_value_info('y',T.FLOAT,[M,N])],inits)
    return h.make_model(g,opset_imports=[h.make_opsetid('',17)]).SerializeToString()
so=ort.SessionOptions(); so.intra_op_num_threads=1
print("M K N float_us int_us ratio")
for (M,K,N) in [(17,32,32),(17,32,128),(64,64,64),(64,64,256),(128,256,256),(128,768,768),(128,768,3072),(1,768,768),(1,4096,4096),(512,768,768)]:
    x=np.random.default_rng(1).standard_normal((M,K)).astype(np.float32)
    ss=[ort.InferenceSession(model(M,K,N,q),so,providers=['CPUExecutionProvider']) for q in (0,1)]
    ts=[[],[]]
    for _ in range(5):
        for i,s in enumerate(ss): s.run(None,{'x':x})
    for _ in range(200 if M*K*N<1e7 else 30):
        for i,s in enumerate(ss):
            t=time.perf_counter(); s.run(None,{'x':x}); ts[i].append(time.perf_counter()-t)
    f,q=[np.median(t)*1e6 for t in ts]
    print(M,K,N,round(f,1),round(q,1),round(q/f,3))
