// Prototype of the direct path's all-reduce as oxccl runs it (process_vm_readv of peers' input
// chunks into scratch, reduce into own output, then pull the other parts from their owners'
// outputs), in lanes: thread t of every rank owns piece t of every part and announces its own
// progress, with parts taken in slices so a peer pulls a slice right after its owner wrote it.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <time.h>
#include <stdatomic.h>
#include <sched.h>
#include <emmintrin.h>
static int G;
static void ntcopy(char*d,const char*s,size_t n){ size_t i=0; while(i<n && ((size_t)(d+i)&15)){d[i]=s[i];i++;} for(;i+64<=n;i+=64){ __m128i a=_mm_loadu_si128((const __m128i*)(s+i)),b=_mm_loadu_si128((const __m128i*)(s+i+16)),c=_mm_loadu_si128((const __m128i*)(s+i+32)),e=_mm_loadu_si128((const __m128i*)(s+i+48)); _mm_stream_si128((__m128i*)(d+i),a);_mm_stream_si128((__m128i*)(d+i+16),b);_mm_stream_si128((__m128i*)(d+i+32),c);_mm_stream_si128((__m128i*)(d+i+48),e);} for(;i<n;i++)d[i]=s[i]; _mm_sfence(); }
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static int P,T,ITERS,me; static size_t S,SL; 
typedef struct{_Atomic long red; _Atomic long pulled; char pad[48];} Lane;
static int W; static char*wins; static int NS=4;
#define WIN(r,t,k) (wins+((((size_t)(r)*T+(t))*NS+(k))*SL))
typedef struct{pid_t pid; float*in,*out; _Atomic long done;} Rank;
static Lane*lanes; static Rank*ranks; static float*in,*out; static long K; static long iter;
#define CH (64<<10)
static void rd(int p,void*dst,const void*src,size_t n){ size_t d=0; while(d<n){ struct iovec l={(char*)dst+d,n-d},r={(char*)src+d,n-d}; ssize_t x=process_vm_readv(ranks[p].pid,&l,1,&r,1,0); if(x<=0){perror("readv");exit(1);} d+=x; } }
static void wt(_Atomic long*w,long v){int s=0; while(atomic_load_explicit(w,memory_order_acquire)<v){ if(++s>100) sched_yield(); }}
static void piece(int p,int t,long j,size_t*lo,size_t*hi){ size_t ne=S/4; size_t a=ne*p/P,b=ne*(p+1)/P; size_t c=a+(b-a)*t/T,d=a+(b-a)*(t+1)/T; size_t e=c+(d-c)*j/K,f=c+(d-c)*(j+1)/K; *lo=e*4;*hi=f*4; }
static void* lane(void*v){ int t=(long)v; char*scr=aligned_alloc(4096,(size_t)P*CH); long base=iter*(K+1);
  for(long j=0;j<=K;j++){
    if(j<K){ size_t lo,hi; piece(me,t,j,&lo,&hi);
      for(size_t o=lo;o<hi;o+=CH){ size_t l=CH<hi-o?CH:hi-o; size_t ne=l/4; float*dst=(float*)((char*)out+o); const float*own=(const float*)((char*)in+o);
        int first=1;
        for(int q=1;q<P;q++){ int p=(me+q)%P; float*s=(float*)(scr+(size_t)p*CH); rd(p,s,(char*)ranks[p].in+o,l);
          if(first){ for(size_t i=0;i<ne;i++) dst[i]=own[i]+s[i]; first=0;} else for(size_t i=0;i<ne;i++) dst[i]+=s[i]; }
      }
      if(W){ if(j>=NS) for(int p=0;p<P;p++) if(p!=me) wt(&lanes[p*T+t].pulled,base+j-NS+1); memcpy(WIN(me,t,j%NS),(char*)out+lo,hi-lo); }
      atomic_store_explicit(&lanes[me*T+t].red,base+j+1,memory_order_release);
    }
    if(j>0) for(int q=1;q<P;q++){ int p=(me+q)%P; size_t lo,hi; piece(p,t,j-1,&lo,&hi); wt(&lanes[p*T+t].red,base+j); if(W) memcpy((char*)out+lo,WIN(p,t,(j-1)%NS),hi-lo); else if(G){ for(size_t o=lo;o<hi;o+=CH){ size_t l=CH<hi-o?CH:hi-o; rd(p,scr,(char*)ranks[p].out+o,l); ntcopy((char*)out+o,scr,l);} } else rd(p,(char*)out+lo,(char*)ranks[p].out+lo,hi-lo); }
    if(W&&j>0) atomic_store_explicit(&lanes[me*T+t].pulled,base+j,memory_order_release);
  }
  free(scr); return 0; }
int main(int argc,char**argv){ P=atoi(argv[1]);T=atoi(argv[2]);S=(size_t)atoi(argv[3])<<20;SL=(size_t)atoi(argv[4])<<10;ITERS=atoi(argv[5]); W=argc>6?atoi(argv[6]):0; G=argc>7?atoi(argv[7]):0;
  lanes=mmap(0,(size_t)P*T*64,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  ranks=mmap(0,4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  _Atomic long*bar=(_Atomic long*)mmap(0,4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  size_t part0=S/P/T; if(W&&!SL){fprintf(stderr,"windows need a slice\n");return 1;}
  if(W) wins=mmap(0,(size_t)P*T*NS*SL,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  for(me=0;me<P-1;me++) if(fork()==0) break;
  prctl(PR_SET_PTRACER,PR_SET_PTRACER_ANY,0,0,0);
  size_t part=S/P/T; K=SL? (part+SL-1)/SL : 1; if(K<1)K=1;
  size_t al=2<<20; in=aligned_alloc(al,S); out=aligned_alloc(al,S); madvise(in,S,MADV_HUGEPAGE);madvise(out,S,MADV_HUGEPAGE);
  for(size_t i=0;i<S/4;i++){in[i]=(float)((i+me)%7);} memset(out,0,S);
  ranks[me].pid=getpid(); ranks[me].in=in; ranks[me].out=out;
  pthread_t th[64]; double sum=0,best=1e9;
  for(iter=0;iter<ITERS+2;iter++){
    atomic_fetch_add(bar,1); wt(bar,(long)P*(2*iter+1));
    double t0=now(); for(long t=1;t<T;t++) pthread_create(&th[t],0,lane,(void*)t); lane(0); for(int t=1;t<T;t++) pthread_join(th[t],0);
    atomic_fetch_add(bar,1); wt(bar,(long)P*(2*iter+2));
    double dt=now()-t0; if(iter>=2){sum+=dt; if(dt<best)best=dt;}
  }
  long bad=0; for(size_t i=0;i<S/4;i++){ float want=0; for(int r=0;r<P;r++) want+=(float)((i+r)%7); if(out[i]!=want) bad++; }
  double avg=sum/ITERS;
  if(me==0) printf("%s P %d T %d size %4zu MiB slice %5zu KiB (%ld slices): avg %.2f ms busbw %.2f GB/s (best %.2f) wrong %ld\n",W?"win ":G?"pull+nt":"pull",P,T,S>>20,SL>>10,K,avg*1e3,2.0*(P-1)/P*S/avg/1e9,2.0*(P-1)/P*S/best/1e9,bad);
  else if(bad) printf("rank %d wrong %ld\n",me,bad);
  while(wait(0)>0); return 0; }
