// Prototype: all-reduce of P processes x T lanes through small shared windows (copy in, reduce a
// sub-part from every window, copy every sub-part out), to see what the 16-core host allows.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
#include <stdatomic.h>
#include <sched.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static int P,T,ITERS; static size_t S,SL; static char*shm; static int me;
typedef struct{_Atomic long copied, reduced, gathered; char pad[64-24];} Flags;
#define FL(r,t) ((Flags*)(shm + ((size_t)(r)*T+(t))*64))
static char* win(int r,int t,int b){size_t hdr=((size_t)P*T*64+4095)&~4095UL; return shm+hdr+(((size_t)r*T+t)*2+b)*SL;}
static float *in,*out;
static void waitall(int which,int t,long k){ for(int r=0;r<P;r++){ Flags*f=FL(r,t); _Atomic long*w=which==0?&f->copied:which==1?&f->reduced:&f->gathered; int spins=0; while(atomic_load_explicit(w,memory_order_acquire)<k){ if(++spins>200) sched_yield(); } } }
static long seq[64];
static void* lane(void*v){ int t=(long)v; size_t per=S/T; size_t lo=t*per; size_t nsl=(per+SL-1)/SL;
  for(size_t j=0;j<nsl;j++){ long k=++seq[t]; int b=k&1; size_t off=lo+j*SL, len=SL<per-j*SL?SL:per-j*SL;
    if(k>2) waitall(2,t,k-2);
    char*w=win(me,t,b); memcpy(w,(char*)in+off,len);
    atomic_store_explicit(&FL(me,t)->copied,k,memory_order_release);
    waitall(0,t,k);
    size_t ne=len/4, a=ne*me/P, e=ne*(me+1)/P; float*o=(float*)w;
    for(int r=0;r<P;r++){ if(r==me) continue; float*x=(float*)win(r,t,b); for(size_t i=a;i<e;i++) o[i]+=x[i]; }
    atomic_store_explicit(&FL(me,t)->reduced,k,memory_order_release);
    waitall(1,t,k);
    for(int r=0;r<P;r++){ size_t ra=(ne*r/P)*4, re=(ne*(r+1)/P)*4; memcpy((char*)out+off+ra, win(r,t,b)+ra, re-ra); }
    atomic_store_explicit(&FL(me,t)->gathered,k,memory_order_release);
  } return 0; }
int main(int argc,char**argv){ P=atoi(argv[1]);T=atoi(argv[2]);S=(size_t)atoi(argv[3])<<20;SL=(size_t)atoi(argv[4])<<10;ITERS=atoi(argv[5]); int huge=argc>6?atoi(argv[6]):1;
  size_t hdr=((size_t)P*T*64+4095)&~4095UL, tot=hdr+(size_t)P*T*2*SL;
  shm=mmap(0,tot,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0); memset(shm,0,tot);
  _Atomic long*bar=(_Atomic long*)mmap(0,4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  for(me=0;me<P-1;me++) if(fork()==0) break; if(me==P-1){} 
  size_t al=2<<20; in=aligned_alloc(al,S); out=aligned_alloc(al,S); if(huge){madvise(in,S,MADV_HUGEPAGE);madvise(out,S,MADV_HUGEPAGE);}
  for(size_t i=0;i<S/4;i++){in[i]=(float)((i+me)%7);} memset(out,0,S);
  pthread_t th[64]; double best=1e9, sum=0;
  for(int it=-2;it<ITERS;it++){
    atomic_fetch_add(bar,1); while(atomic_load(bar)< (long)P*(it+3)) ;
    double t0=now(); for(long t=1;t<T;t++) pthread_create(&th[t],0,lane,(void*)t); lane(0); for(int t=1;t<T;t++) pthread_join(th[t],0);
    double dt=now()-t0; if(it>=0){sum+=dt; if(dt<best)best=dt;}
  }
  long bad=0; for(size_t i=0;i<S/4;i++){ float want=0; for(int r=0;r<P;r++) want+=(float)((i+r)%7); if(out[i]!=want) bad++; }
  double avg=sum/ITERS, bus=2.0*(P-1)/P*S/avg/1e9;
  if(me==0) printf("proto P %d T %d size %4zu MiB slice %4zu KiB: avg %.2f ms busbw %.2f GB/s (best %.2f) wrong %ld\n",P,T,S>>20,SL>>10,avg*1e3,bus,2.0*(P-1)/P*S/best/1e9,bad);
  else if(bad) printf("rank %d wrong %ld\n",me,bad);
  if(me!=P-1){} while(wait(0)>0); return 0; }
