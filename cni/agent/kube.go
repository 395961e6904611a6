package agent

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// KubeSource watches the cluster's Node objects through a client-go informer.
type KubeSource struct {
	lister  listersv1.NodeLister
	synced  cache.InformerSynced
	changed chan struct{}
}

// NewKubeSource starts an informer on Nodes and waits (until ctx ends) for its first list.
func NewKubeSource(ctx context.Context, client kubernetes.Interface, resync time.Duration) (*KubeSource, error) {
	f := informers.NewSharedInformerFactory(client, resync)
	inf := f.Core().V1().Nodes()
	k := &KubeSource{lister: inf.Lister(), synced: inf.Informer().HasSynced, changed: make(chan struct{}, 1)}
	signal := func() { notify(k.changed) }
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { signal() },
		// a kubelet updates its Node every few seconds (heartbeats, conditions): only a change
		// of what the routes are made of starts a pass
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			c, ok2 := cur.(*corev1.Node)
			if !ok1 || !ok2 || !reflect.DeepEqual(FromNode(o), FromNode(c)) {
				signal()
			}
		},
		DeleteFunc: func(any) { signal() },
	}); err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), k.synced) {
		return nil, fmt.Errorf("the Node informer did not sync: %w", ctx.Err())
	}
	return k, nil
}

// Nodes lists the nodes from the informer's cache.
func (k *KubeSource) Nodes() ([]Node, error) {
	list, err := k.lister.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	out := make([]Node, 0, len(list))
	for _, n := range list {
		out = append(out, FromNode(n))
	}
	return out, nil
}

// Changed is signalled on every add, update and delete of a Node.
func (k *KubeSource) Changed() <-chan struct{} { return k.changed }

// FromNode takes what the agent needs of a Node: its first IPv4 InternalIP and its pod
// networks (spec.podCIDRs, or the older spec.podCIDR).
func FromNode(n *corev1.Node) Node {
	out := Node{Name: n.Name}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Is4() {
			out.Address = ip.String()
			break
		}
	}
	out.PodCIDRs = append(out.PodCIDRs, n.Spec.PodCIDRs...)
	if len(out.PodCIDRs) == 0 && n.Spec.PodCIDR != "" {
		out.PodCIDRs = []string{n.Spec.PodCIDR}
	}
	return out
}

// KubeServices watches the cluster's Services and EndpointSlices through client-go informers,
// and this node's Node object (its zone, for topology-aware routing).
type KubeServices struct {
	svcs    listersv1.ServiceLister
	slices  discoverylisters.EndpointSliceLister
	nodes   listersv1.NodeLister // this node only
	node    string
	changed chan struct{}
}

// NewKubeServices starts informers on Services, EndpointSlices and the Node named node, and
// waits (until ctx ends) for their first lists.
func NewKubeServices(ctx context.Context, client kubernetes.Interface, resync time.Duration, node string) (*KubeServices, error) {
	f := informers.NewSharedInformerFactory(client, resync)
	si := f.Core().V1().Services()
	ei := f.Discovery().V1().EndpointSlices()
	// the node's own object only (a watch of its own: the routes' informer, when it runs, is
	// another factory's, and a static --nodes file has no zones)
	nf := informers.NewSharedInformerFactoryWithOptions(client, resync, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", node).String()
	}))
	ni := nf.Core().V1().Nodes()
	k := &KubeServices{svcs: si.Lister(), slices: ei.Lister(), nodes: ni.Lister(), node: node, changed: make(chan struct{}, 1)}
	signal := func() { notify(k.changed) }
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { signal() },
		UpdateFunc: func(any, any) { signal() },
		DeleteFunc: func(any) { signal() },
	}
	for _, inf := range []cache.SharedIndexInformer{si.Informer(), ei.Informer()} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return nil, err
		}
	}
	// of the Node, only its zone matters here: its status updates start no pass
	zone := func(o any) string {
		if n, ok := o.(*corev1.Node); ok {
			return n.Labels[corev1.LabelTopologyZone]
		}
		return ""
	}
	if _, err := ni.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { signal() },
		UpdateFunc: func(old, cur any) {
			if zone(old) != zone(cur) {
				signal()
			}
		},
		DeleteFunc: func(any) { signal() },
	}); err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	nf.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), si.Informer().HasSynced, ei.Informer().HasSynced, ni.Informer().HasSynced) {
		return nil, fmt.Errorf("the Service, EndpointSlice and Node informers did not sync: %w", ctx.Err())
	}
	return k, nil
}

// Services lists the Services and EndpointSlices from the informers' caches.
func (k *KubeServices) Services() ([]*corev1.Service, []*discoveryv1.EndpointSlice, error) {
	svcs, err := k.svcs.List(labels.Everything())
	if err != nil {
		return nil, nil, err
	}
	slices, err := k.slices.List(labels.Everything())
	if err != nil {
		return nil, nil, err
	}
	return svcs, slices, nil
}

// Locality is this node's name and its zone label (none while its Node is not in the cache).
func (k *KubeServices) Locality() Locality {
	l := Locality{Node: k.node}
	if n, err := k.nodes.Get(k.node); err == nil {
		l.Zone, l.Known = n.Labels[corev1.LabelTopologyZone], true
	}
	return l
}

// ServicesChanged is signalled on every add, update and delete of a Service or EndpointSlice,
// and when this node's Node comes, goes or changes its zone.
func (k *KubeServices) ServicesChanged() <-chan struct{} { return k.changed }

// notify says "changed" on ch without blocking: signals coalesce while a pass is pending.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
